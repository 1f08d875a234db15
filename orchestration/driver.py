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

from ..common.cluster.timeouts import worker_start_timeout_s
from ..common.config.run import G2RPOConfig
from ..common.health.guard import Guard
from ..common.prompts.prompts import prompts_for, read_prompts
from ..planning.check import refuse_misfit
from ..run_directory.files import checkpoint_to_resume, read_metrics
from ..run_directory.healthy import note_guard_reading
from .bookkeeping import Bookkeeping, Step
from .budget import Budget
from .cluster import RunActors, record_actors, start_actors
from .evaluations import (
    PendingEval,
    evaluate_part,
    gather,
    record_evaluation,
    returned_samples,
    set_images_aside,
    start_parts,
)
from .lifecycle import (
    attach_telemetry,
    checkpoint_due,
    finish,
    nothing_left,
    open_run,
    resume_point,
    stops_short,
)
from .phase_clock import PhaseClock
from .placement import object_store_too_small
from .publishing import Published, publisher_for
from .records import progress_fields
from .recovery import run_with_recovery
from .rollouts import PendingRollout, collect_shares, split_prompts
from .warm_actors import WarmActors

__all__ = ["read_metrics", "train"]


@dataclass
class TrainingLoop(Bookkeeping):
    cfg: G2RPOConfig
    run_dir: Path
    actors: RunActors
    train_prompts: list[str]
    eval_prompts: list[str]  # each eval prompt repeated train.eval.per_prompt times
    budget: Budget = field(init=False)
    publisher: object = field(init=False)
    guard: Guard = field(init=False)
    first_eval: dict | None = None
    last_eval_nfe: int | None = None
    exporter: object = None
    status: object = None
    next_rollout: PendingRollout | None = None  # weights.staleness >= 1: started beside the update
    published: Published | None = None
    step: Step | None = None  # the iteration whose update is in flight or being recorded
    store_checked: bool = False  # the object stores measured against a published version
    restart_s: float = field(init=False)  # train.workers.start_timeout_s, resolved
    # told at each phase boundary (``at(point, loop, iteration)``): `g2rpo rehearse`
    # times phases and injects its faults there
    hooks: object = None
    learner_restarts: int = 0  # learner groups formed again in this run (recovery.py)
    # time.monotonic() of the last curves.png, or of the start: the first is drawn a minute
    # in (a run shorter than that draws it once, at its end)
    curves_drawn_at: float = field(default_factory=time.monotonic)
    # time.monotonic() of the last checkpoint, or of the session's start
    # (train.checkpoints.every_minutes counts from it)
    checkpointed_at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.budget = Budget(self.cfg.run.nfe_budget)
        self.guard = Guard(self.cfg.train.guard, say=lambda m: print(m, file=sys.stderr))
        self.publisher = publisher_for(self.actors, self.cfg)
        self.restart_s = worker_start_timeout_s(self.cfg)

    # ------------------------------------------------------------------ phases
    def at(self, point: str, it: int) -> None:
        if self.hooks is not None:
            self.hooks.at(point, self, it)

    def publish(self) -> Published:
        """The learner's current weights to every rollout worker, by object store or
        broadcast (``train.weights.transport``); each verifies version and checksum."""
        self.at("publish", -1)
        self.actors.rewards.refresh(timeout=self.cfg.train.placement_timeout_s)
        published = self.publisher.publish()
        if not self.store_checked:  # once a session: the first version's size says it
            self.store_checked = True
            if line := object_store_too_small(published.nbytes):
                print(line, file=sys.stderr)
        return published

    def evaluate(self, it: int, weights: Published, forced: bool) -> PendingEval | None:
        """Start the held-out evaluation of the published weights (every train.eval.every
        iterations, and when ``forced``); it runs on the evaluator while the workers
        roll out. Without an evaluator it is spread over the workers, each a slice,
        before the rollout (evaluations.py)."""
        if not (self.eval_due(it) or forced):
            return None
        if self.actors.evaluator is not None:
            weights.load_on(self.actors.evaluator)  # actor calls run in order: no wait
            actors = [self.actors.evaluator]
        else:
            actors = list(self.actors.workers)
        t = self.cfg.train
        endpoints = self.actors.rewards.endpoints()
        grid = returned_samples(len(self.eval_prompts), t.eval)
        parts = start_parts(actors, self.eval_prompts, t.eval.seed, grid, endpoints)
        return PendingEval(it, weights, parts, self.budget.total)

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
        t = self.cfg.train
        grid = returned_samples(len(self.eval_prompts), t.eval)

        def redo(actor, part):
            ray.get(pending.weights.load_on(actor))
            endpoints = self.actors.rewards.endpoints()
            return evaluate_part(part, self.eval_prompts, t.eval.seed, grid, endpoints)

        samples = gather(pending, redo, t.eval.timeout_s, self.restart_s)
        if samples is None:
            return {"eval_timed_out": 1}
        if t.eval.keep_images:
            samples = set_images_aside(self.run_dir, pending.iteration, samples, t.eval.per_prompt)
        record, row = record_evaluation(
            self.run_dir,
            pending,
            samples,
            self.eval_prompts,
            t.eval.per_prompt,
            self.first_eval,
            {r.name: r.weight for r in self.cfg.rewards},
        )
        self.last_eval_nfe = pending.nfe_train_total
        if self.first_eval is None:
            self.first_eval = record
        return row

    def launch_rollout(self, it: int, weights: Published) -> PendingRollout:
        """Each worker starts rolling out its share of the iteration's prompts (and
        scoring the leaves) with the weights it holds, ``weights``."""
        workers = self.actors.workers
        counts = self.cfg.train.workers.prompt_shares(self.cfg.sampling.prompts_per_worker)
        prompts = prompts_for(self.train_prompts, self.cfg.run.seed, it, sum(counts))
        shares = split_prompts(prompts, counts)
        rewards = self.actors.rewards.endpoints()
        calls = [w.rollout.remote(it, sh, rewards) for w, sh in zip(workers, shares, strict=True)]
        self.at("rollout", it)
        return PendingRollout(it, weights, shares, [c[0] for c in calls], [c[1] for c in calls])

    def collect_rollout(self, pending: PendingRollout) -> tuple[list, list]:
        """The workers' rollout summaries, and refs to their trajectories (rollouts.py:
        a dead or stuck worker is restarted and redoes its share once)."""
        return collect_shares(
            pending,
            self.actors,
            self.cfg.train.workers.rollout_timeout_s,
            self.restart_s,
            self.published,
        )

    def roll_out(self, it: int, weights: Published) -> tuple[list, list]:
        return self.collect_rollout(self.launch_rollout(it, weights))

    def start_learning(self, it, weights, summaries, trajectories, evaluation, clock) -> Step:
        """Send the iteration's trajectories (by reference) to the learner group; from
        here a stop finishes the iteration (``finish_step``)."""
        self.at("learn", it)
        update = self.actors.learner.start_update(trajectories)
        self.step = Step(it, weights, summaries, update, evaluation, clock)
        return self.step

    def learned(self, step: Step) -> dict:
        """The learner group's update statistics (the ranks' answers)."""
        if step.stats is None:
            step.stats = self.actors.learner.finish(step.update, "update")
        return step.stats

    def evaluated(self, step: Step) -> dict:
        if not isinstance(step.evaluation, dict):
            step.evaluation = self.collect_evaluation(step.evaluation)
        return step.evaluation

    def finish_step(self, step: Step) -> dict:
        """The step's metrics row, its update and evaluation waited for."""
        self.learned(step)
        self.evaluated(step)
        row = self.summary(step)
        self.step = None
        return row

    # ------------------------------------------------------------------ the loop
    def iteration(self, it: int, last: bool, evaluate: bool = False) -> dict:
        """One iteration; ``last``: the session's (no rollout is started beyond it);
        ``evaluate``: evaluate it whatever train.eval.every says."""
        if self.cfg.train.weights.staleness >= 1:
            return self.overlapped_iteration(it, last, evaluate)
        clock = PhaseClock()
        with clock.phase("publish"):
            weights = self.publish()
        with clock.aside():  # bookkeeping, not a phase of the algorithm
            record_actors(self.run_dir, self.actors)
        with clock.phase("eval"):  # without an evaluator it runs here, on worker 0
            evaluation = self.evaluate(it, weights, evaluate)
            if self.actors.evaluator is None:
                evaluation = self.collect_evaluation(evaluation)
        with clock.phase("rollout_and_reward"):
            summaries, trajectories = self.roll_out(it, weights)
        step = self.start_learning(it, weights, summaries, trajectories, evaluation, clock)
        with clock.phase("learn"):
            self.learned(step)
        with clock.phase("eval"):  # the wait for the evaluator, off the critical path
            self.evaluated(step)
        return self.finish_step(step)

    def overlapped_iteration(self, it: int, last: bool, evaluate: bool = False) -> dict:
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
        pending = self.evaluate(it, self.published, evaluate)  # the newest weights, in order
        with clock.phase("rollout_and_reward"):
            summaries, trajectories = self.collect_rollout(sampled)
        # the workers hold the newest weights: the next rollout starts on them now
        self.next_rollout = None if last else self.launch_rollout(it + 1, self.published)
        step = self.start_learning(it, sampled.weights, summaries, trajectories, pending, clock)
        with clock.phase("learn"):
            self.learned(step)
        with clock.phase("eval"):
            self.evaluated(step)
        if self.next_rollout is not None:
            with clock.phase("publish"):  # each worker loads it after that rollout
                self.published = self.publish()
        return self.finish_step(step)

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
                if self.budget.exhausted() or self.guard.stops:
                    break  # (a resumed run the guard had stopped trains no further)
                last = it == end - 1 or self.budget.next_is_last()
                # a finished run's trained weights are evaluated by finish() (lifecycle),
                # one update after this iteration's: at FLUX scale an evaluation is
                # minutes of every worker. A session that stops short of the run's end
                # (--max-iterations) evaluates its last iteration here instead.
                short = stops_short(it, end, self.cfg.run.iterations)
                row = self.iteration(it, last, evaluate=short)
                row.update(self.guard.observe(row))  # train.guard: hacking judged here
                note_guard_reading(self.run_dir, row, self.guard.tripped)
                done = it + 1
                stop = done == end or self.budget.exhausted() or self.guard.stops
                self.record(row, stop)
                since = time.monotonic() - self.checkpointed_at
                if stop or checkpoint_due(done, since, self.cfg.train.checkpoints):
                    self.checkpoint(done, last=stop)
                bar.set_postfix(progress_fields(row, self.cfg))
                bar.update(row["nfe_train"] if nfe_budget else 1)
                if stop:
                    break
        except KeyboardInterrupt:
            done = self.finish_interrupted(done)
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
    hooks=None,
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
    from ..planning.offload_choice import with_offload_chosen

    cfg = with_offload_chosen(cfg)  # train.offload auto: the plan's (config.yaml keeps auto)
    if resume is not None:
        checkpoint_to_resume(run_dir)  # a recorded checkpoint missing: stop before any actor
    t = cfg.train
    train_prompts = read_prompts(t.prompts, "train.prompts")
    eval_prompts = read_prompts(t.eval.prompts, "train.eval.prompts")[: t.eval.samples]
    eval_prompts = [p for p in eval_prompts for _ in range(t.eval.per_prompt)]
    actors = start_actors(cfg, redis_url, warm, run_dir)
    ended = False
    try:
        loop = TrainingLoop(cfg, run_dir, actors, train_prompts, eval_prompts, hooks=hooks)
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
