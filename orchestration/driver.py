"""``g2rpo train``: the driver. Rollout workers, the learner and the evaluator are
Ray actors; rewards come from reward-server replicas (started by the job when none
are configured). Each iteration runs the algorithm's phases in order:

    publish → evaluate (started; runs beside the rollout) → roll out → learn → record

With ``train.weights.staleness >= 1`` the next iteration's rollout runs beside the update
instead (``overlapped_iteration``): roll out it+1 on v_it ‖ learn it → publish v_it+1.

Everything an iteration draws is a pure function of (seed, iteration, worker), so
a redone rollout or a resumed run reproduces itself."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import ray
from tqdm.auto import tqdm

from ..common.config import G2RPOConfig
from ..common.errors import RunFailed
from ..common.prompts import prompts_for, read_prompts
from ..learner.trainer import sharded_learner
from ..planning.check import refuse_misfit
from ..run_directory.files import (
    append_metrics,
    checkpoint_path,
    draw_curves,
    prune_checkpoints,
    read_metrics,
    replace_other_layout,
    save_evaluation,
    write_sample_grid,
)
from .budget import Budget
from .cluster import RunActors, call_with_restart, get_or_redo, record_actors, start_actors
from .lifecycle import attach_telemetry, finish, nothing_left, open_run, resume_point
from .phase_clock import PhaseClock
from .publishing import Published, check_loaded, publisher_for
from .records import eval_row, progress_fields, summarise_batches
from .recovery import run_with_recovery
from .warm_actors import WarmActors

__all__ = ["read_metrics", "train"]

CURVES_EVERY_S = 60.0


@dataclass
class PendingEval:
    iteration: int
    actor: object
    weights: Published
    ref: object
    nfe_train_total: int


@dataclass
class PendingRollout:
    iteration: int
    weights: Published
    shares: list
    refs: list


@dataclass
class TrainingLoop:
    cfg: G2RPOConfig
    run_dir: Path
    actors: RunActors
    train_prompts: list[str]
    eval_prompts: list[str]  # each eval prompt repeated train.eval.per_prompt times
    budget: Budget = field(init=False)
    publisher: object = field(init=False)
    first_eval: dict | None = None
    last_eval_nfe: int | None = None
    exporter: object = None
    status: object = None
    next_rollout: PendingRollout | None = None  # weights.staleness >= 1: started beside the update
    published: Published | None = None
    learner_restarts: int = 0  # learner groups formed again in this run (recovery.py)
    # time.monotonic() of the last curves.png, or of the start: the first is drawn a minute
    # in (a run shorter than that draws it once, at its end)
    curves_drawn_at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.budget = Budget(self.cfg.run.nfe_budget)
        self.publisher = publisher_for(self.actors, self.cfg)

    # ------------------------------------------------------------------ phases
    def publish(self) -> Published:
        """The learner's current weights to every rollout worker, by object store or
        broadcast (``train.weights.transport``); each verifies version and checksum."""
        self.actors.rewards.refresh(timeout=self.cfg.train.placement_timeout_s)
        return self.publisher.publish()

    def evaluate(self, it: int, weights: Published, last: bool) -> PendingEval | None:
        """Start the held-out evaluation of the published weights (every train.eval.every
        iterations and at the last one); it runs on the evaluator while the workers
        roll out. Without an evaluator it runs on worker 0 before the rollout."""
        t = self.cfg.train
        if not (self.eval_due(it) or last):
            return None
        actor = self.actors.evaluator or self.actors.workers[0]
        if self.actors.evaluator is not None:
            weights.load_on(actor)  # actor calls run in order: no wait needed
        ref = actor.evaluate.remote(self.eval_prompts, t.eval.seed, self.actors.rewards.endpoints())
        return PendingEval(it, actor, weights, ref, self.budget.total)

    def eval_due(self, it: int) -> bool:
        every = self.cfg.train.eval.every_nfe
        if every is None:
            return it % self.cfg.train.eval.every == 0
        return self.last_eval_nfe is None or self.budget.total - self.last_eval_nfe >= every

    def collect_evaluation(self, pending: PendingEval | None) -> dict:
        """Wait for an evaluation; record its per-sample scores and a sample grid;
        return its row entries (means, and the paired change since iteration 0)."""
        if pending is None:
            return {}
        from ..evaluation.metrics import pass_from_scores

        def redo(actor):
            ray.get(pending.weights.load_on(actor))
            return actor.evaluate.remote(
                self.eval_prompts, self.cfg.train.eval.seed, self.actors.rewards.endpoints()
            )

        try:
            samples = ray.get(pending.ref)
        except ray.exceptions.RayActorError:  # restarted by Ray: load the weights, redo
            samples = call_with_restart(redo, pending.actor)
        if samples.version != pending.weights.version:
            # restarted by Ray after the weights reached it and before the evaluation:
            # the new actor sampled with the weights it starts with. Redo it.
            samples = call_with_restart(redo, pending.actor)
        per_prompt = self.cfg.train.eval.per_prompt
        values = pass_from_scores(samples.scores)
        record = {
            "iteration": pending.iteration,
            "version": pending.weights.version,
            "nfe_train_total": pending.nfe_train_total,
            "prompts": self.eval_prompts[::per_prompt],
            "per_prompt": per_prompt,
            "scores": {k: v.round(6).tolist() for k, v in values.items()},
        }
        save_evaluation(self.run_dir, pending.iteration, record)
        self.last_eval_nfe = pending.nfe_train_total
        row = eval_row(values, self.first_eval, per_prompt)
        if self.first_eval is None:
            self.first_eval = record
        write_sample_grid(
            self.run_dir / "samples" / f"it_{pending.iteration:05d}.png",
            samples.images,
            self.eval_prompts,
            per_prompt,
            title=f"iteration {pending.iteration} (weights v{pending.weights.version}), "
            "held-out prompts",
        )
        return {**row, "time/eval_work_s": samples.seconds}

    def launch_rollout(self, it: int, weights: Published) -> PendingRollout:
        """Each worker starts rolling out its share of the iteration's prompts (and
        scoring the leaves) with the weights it holds, ``weights``."""
        P, workers = self.cfg.sampling.prompts_per_worker, self.actors.workers
        prompts = prompts_for(self.train_prompts, self.cfg.run.seed, it, P * len(workers))
        shares = [prompts[i * P : (i + 1) * P] for i in range(len(workers))]
        rewards = self.actors.rewards.endpoints()
        refs = [w.rollout.remote(it, sh, rewards) for w, sh in zip(workers, shares, strict=True)]
        return PendingRollout(it, weights, shares, refs)

    def collect_rollout(self, pending: PendingRollout) -> list:
        """The workers' trajectories. A worker that died, or whose share is not back
        within ``train.workers.rollout_timeout_s`` (then it is killed), is restarted by Ray,
        loads the weights the rollout was started with and redoes its share once; the
        late result is never used, so no trajectory is trained twice or lost. So does a
        worker that Ray restarted between the publish and its share, whose share comes
        back sampled with other weights than the ones published for it."""
        timeout = self.cfg.train.workers.rollout_timeout_s
        results = []
        for i, ref in enumerate(pending.refs):
            worker, redone = self.actors.workers[i], []

            def redo(actor, share=pending.shares[i], redone=redone):
                redone.append(True)
                ray.get(pending.weights.load_on(actor))
                rewards = self.actors.rewards.endpoints()
                return actor.rollout.remote(pending.iteration, share, rewards)

            try:
                result = get_or_redo(ref, redo, worker, timeout)
                if result.version != pending.weights.version:
                    # restarted by Ray after the weights reached it and before this share:
                    # the new actor rolled out with the weights it starts with. Redo it.
                    result = call_with_restart(redo, worker, timeout=timeout)
                results.append(result)
            except ray.exceptions.GetTimeoutError:
                raise RunFailed(
                    f"rollout worker {i} did not finish iteration {pending.iteration}'s share "
                    f"within train.workers.rollout_timeout_s={timeout} s, twice"
                ) from None
            newest = self.published
            if redone and newest is not None and newest.version != pending.weights.version:
                # overlapped: the redo loaded the version it was sampled with; the
                # next rollout needs the newest again
                got = get_or_redo(newest.load_on(worker), newest.load_on, worker, timeout)
                check_loaded(i, got, newest)
        return results

    def roll_out(self, it: int, weights: Published) -> list:
        return self.collect_rollout(self.launch_rollout(it, weights))

    def learn(self, batches: list) -> dict:
        return self.actors.learner.update(batches)

    def record(self, row: dict, last: bool) -> None:
        append_metrics(self.run_dir, row)
        if self.exporter is not None:
            self.exporter.observe(row)
        if self.status is not None:
            self.status.publish(row, self.run_dir, "finished" if last else "running")

    def checkpoint(self, done: int, last: bool = False) -> None:
        sharded = sharded_learner(self.cfg)
        replace_other_layout(self.run_dir, done, sharded)
        self.actors.learner.save(str(checkpoint_path(self.run_dir, done, sharded)))
        prune_checkpoints(self.run_dir, self.cfg)
        # curves.png at the session's last checkpoint, and at most once a minute before:
        # a redraw is 0.5 s of driver time on 2 cores, a quarter of a tiny-world iteration
        now = time.monotonic()
        if last or now - self.curves_drawn_at >= CURVES_EVERY_S:
            draw_curves(self.run_dir, self.cfg.run.name)
            self.curves_drawn_at = now

    # ------------------------------------------------------------------ the loop
    def iteration(self, it: int, last: bool) -> dict:
        if self.cfg.train.weights.staleness >= 1:
            return self.overlapped_iteration(it, last)
        clock = PhaseClock()
        with clock.phase("publish"):
            weights = self.publish()
        with clock.aside():  # bookkeeping, not a phase of the algorithm
            record_actors(self.run_dir, self.actors)
        with clock.phase("eval"):  # without an evaluator it runs here, on worker 0
            pending = self.evaluate(it, weights, last)
            if self.actors.evaluator is None:
                evaluation = self.collect_evaluation(pending)
        with clock.phase("rollout_and_reward"):
            batches = self.roll_out(it, weights)
        with clock.phase("learn"):
            stats = self.learn(batches)
        if self.actors.evaluator is not None:
            with clock.phase("eval"):  # the wait for the evaluator, off the critical path
                evaluation = self.collect_evaluation(pending)
        return self.summary(it, weights, batches, stats, evaluation, clock)

    def overlapped_iteration(self, it: int, last: bool) -> dict:
        """``train.weights.staleness >= 1``: iteration it+1's rollout runs on the weights the
        workers hold (v_it) while the learner updates on iteration it's batch; the new
        weights are published behind that rollout. Every batch is learned one version
        late (``weight_lag`` 1), which the PPO ratio against the recorded log-probs
        corrects. The first iteration of a session starts from the published weights."""
        clock = PhaseClock()
        if self.next_rollout is None:
            with clock.phase("publish"):
                self.published = self.publish()
            self.next_rollout = self.launch_rollout(it, self.published)
        with clock.aside():
            record_actors(self.run_dir, self.actors)
        sampled = self.next_rollout
        pending = self.evaluate(it, self.published, last)  # the newest weights, as in order
        with clock.phase("rollout_and_reward"):
            batches = self.collect_rollout(sampled)
        # the workers hold the newest weights: the next rollout starts on them now
        self.next_rollout = None if last else self.launch_rollout(it + 1, self.published)
        with clock.phase("learn"):
            stats = self.learn(batches)
        with clock.phase("eval"):
            evaluation = self.collect_evaluation(pending)
        if self.next_rollout is not None:
            with clock.phase("publish"):  # each worker loads it after that rollout
                self.published = self.publish()
        return self.summary(it, sampled.weights, batches, stats, evaluation, clock)

    def summary(self, it, weights: Published, batches, stats, evaluation, clock) -> dict:
        """The iteration's metrics row. ``time/<phase>_s`` is the driver's wall time
        in each phase (``publish`` with overlapped iterations includes waiting for the
        rollout in flight); ``time/weight_push_s`` is the push's own work in either
        mode (rank 0 producing the version + the slowest worker loading it)."""
        row = {"iteration": it, "version": weights.version, "weights_bytes": weights.nbytes}
        row["weights_via"] = weights.via
        row.update(self.publisher.counters())
        if self.learner_restarts:
            row["learner_restarts"] = self.learner_restarts
        row.update(summarise_batches(batches, stats))
        self.budget.add(row["nfe_train"])
        row["nfe_train_total"] = self.budget.total
        row.update(evaluation)
        row.update(clock.row())
        row.setdefault("time/eval_s", 0.0)
        row["time/weight_push_s"] = weights.push_s
        row["time/rollout_s"] = max(b.timings["rollout_s"] for b in batches)
        row["time/reward_s"] = max(b.timings["reward_s"] for b in batches)
        return row

    def run(self, start: int, end: int, progress: bool) -> int:
        """Iterations start..end-1 (fewer when the NFE budget runs out); returns the
        number of iterations done."""
        # under an NFE budget the run stops when the budget does, not at run.iterations:
        # count the bar in training NFEs so its total and ETA are the run's
        nfe_budget = self.cfg.run.nfe_budget
        bar = tqdm(
            desc=f"train {self.cfg.run.name}",
            disable=not progress,
            initial=self.budget.total if nfe_budget else start,
            total=nfe_budget or self.cfg.run.iterations,
            unit=" NFE" if nfe_budget else "it",
            unit_scale=bool(nfe_budget),
        )
        done = start
        try:
            for it in range(start, end):
                if self.budget.exhausted():
                    break
                last = it == end - 1 or self.budget.next_is_last()
                row = self.iteration(it, last)
                done = it + 1
                stop = done == end or self.budget.exhausted()
                self.record(row, stop)
                t = self.cfg.train
                if done % t.checkpoints.every == 0 or stop or done in t.checkpoints.at:
                    self.checkpoint(done, last=stop)
                bar.set_postfix(progress_fields(row, self.cfg))
                bar.update(row["nfe_train"] if nfe_budget else 1)
                if stop:
                    break
        except KeyboardInterrupt:
            self.checkpoint(done, last=True)
            print(
                f"\ninterrupted after iteration {done}; resume with: "
                f"g2rpo train --resume {self.run_dir}",
                file=sys.stderr,
            )
            raise
        finally:
            bar.close()
        return done


def train(
    config: str | Path | None,
    overrides: list[str],
    *,
    resume: str | Path | None = None,
    redis_url: str | None = None,
    progress: bool = True,
    max_iterations: int | None = None,
    warm: WarmActors | None = None,
) -> Path:
    """Train (or resume) one run; returns its directory. ``warm``: actors kept from
    an earlier run of this process are taken first, and this run's are kept when it
    ends normally (orchestration/warm_actors.py)."""
    cfg, run_dir = open_run(config, overrides, resume)
    if resume is not None and nothing_left(cfg, run_dir):
        print(f"{run_dir} is finished: nothing left to do", file=sys.stderr)
        return run_dir
    cfg.model.check_trainable()  # before any actor loads a model
    refuse_misfit(cfg)  # a CUDA run that `g2rpo plan` says cannot fit stops here
    t = cfg.train
    train_prompts = read_prompts(t.prompts, "train.prompts")
    eval_prompts = read_prompts(t.eval.prompts, "train.eval.prompts")[: t.eval.samples]
    eval_prompts = [p for p in eval_prompts for _ in range(t.eval.per_prompt)]
    actors = start_actors(cfg, redis_url, warm)
    ended = False
    try:
        loop = TrainingLoop(cfg, run_dir, actors, train_prompts, eval_prompts)
        start = resume_point(loop) if resume is not None else 0
        end = cfg.run.iterations
        if max_iterations is not None:
            end = min(end, start + max_iterations)
        attach_telemetry(loop)
        try:
            done = run_with_recovery(loop, start, end, progress)
        finally:
            if loop.exporter is not None:
                loop.exporter.close()
        finish(loop, start, done)
        record_actors(run_dir, actors)  # as the session leaves them (Ray restarts included)
        ended = True
    finally:
        if ended and warm is not None:
            warm.keep(actors)
        else:
            actors.stop()
    return run_dir
