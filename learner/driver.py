"""``g2rpo train``: the driver. Rollout workers, the learner and the evaluator are
Ray actors; rewards come from reward-server replicas (started by the job when none
are configured). Each iteration runs the algorithm's phases in order:

    publish → evaluate (started; runs beside the rollout) → roll out → learn → record

Everything an iteration draws is a pure function of (seed, iteration, worker), so
a redone rollout or a resumed run reproduces itself."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import ray
from tqdm.auto import tqdm

from ..common.config import G2RPOConfig, dump_config, load_config
from ..common.prompts import prompts_for, read_prompts
from .budget import Budget
from .cluster import RunActors, call_with_restart, record_actors, start_actors
from .records import eval_row, progress_fields, summarise_batches
from .run_files import (
    CKPT,
    append_metrics,
    checkpoint_path,
    draw_curves,
    export_final,
    latest_checkpoint,
    mark_finished,
    prune_checkpoints,
    read_evaluations,
    read_metrics,
    save_evaluation,
    truncate_metrics,
    write_sample_grid,
)

__all__ = ["read_metrics", "train"]


@dataclass(frozen=True)
class Published:
    version: int
    ref: object
    checksum: str
    nbytes: int

    def load_on(self, actor):
        return actor.load_weights.remote(self.version, self.ref, self.checksum)


@dataclass
class PendingEval:
    iteration: int
    actor: object
    weights: Published
    ref: object
    nfe_train_total: int


@dataclass
class TrainingLoop:
    cfg: G2RPOConfig
    run_dir: Path
    actors: RunActors
    train_prompts: list[str]
    eval_prompts: list[str]  # each eval prompt repeated train.eval_per_prompt times
    budget: Budget = field(init=False)
    first_eval: dict | None = None
    last_eval_nfe: int | None = None
    exporter: object = None
    status: object = None

    def __post_init__(self) -> None:
        self.budget = Budget(self.cfg.run.nfe_budget)

    # ------------------------------------------------------------------ phases
    def publish(self) -> Published:
        """The learner's current weights, once into the object store; every rollout
        worker loads and verifies them (a restarted worker loads them again)."""
        version, (ref,), checksum, nbytes = ray.get(self.actors.learner.publish.remote())
        weights = Published(version, ref, checksum, nbytes)
        self.actors.rewards.refresh(timeout=self.cfg.train.placement_timeout_s)
        workers = self.actors.workers
        pending = [weights.load_on(w) for w in workers]
        for i, ref_i in enumerate(pending):
            try:
                got = ray.get(ref_i)
            except ray.exceptions.RayActorError:
                got = call_with_restart(weights.load_on, workers[i])
            if got != (version, checksum):
                raise RuntimeError(f"worker {i} loaded {got}, expected {(version, checksum)}")
        return weights

    def evaluate(self, it: int, weights: Published, last: bool) -> PendingEval | None:
        """Start the held-out evaluation of the published weights (every eval_every
        iterations and at the last one); it runs on the evaluator while the workers
        roll out. Without an evaluator it runs on worker 0 before the rollout."""
        t = self.cfg.train
        if not (self.eval_due(it) or last):
            return None
        actor = self.actors.evaluator or self.actors.workers[0]
        if self.actors.evaluator is not None:
            weights.load_on(actor)  # actor calls run in order: no wait needed
        ref = actor.evaluate.remote(self.eval_prompts, t.eval_seed, *self.actors.rewards.args())
        return PendingEval(it, actor, weights, ref, self.budget.total)

    def eval_due(self, it: int) -> bool:
        every = self.cfg.train.eval_every_nfe
        if every is None:
            return it % self.cfg.train.eval_every == 0
        return self.last_eval_nfe is None or self.budget.total - self.last_eval_nfe >= every

    def collect_evaluation(self, pending: PendingEval | None) -> dict:
        """Wait for an evaluation; record its per-sample scores and a sample grid;
        return its row entries (means, and the paired change since iteration 0)."""
        if pending is None:
            return {}
        from ..evaluation.metrics import pass_from_scores

        t0 = time.perf_counter()
        try:
            images, scores, work_s = ray.get(pending.ref)
        except ray.exceptions.RayActorError:  # restarted by Ray: load the weights, redo

            def redo(actor):
                ray.get(pending.weights.load_on(actor))
                return actor.evaluate.remote(
                    self.eval_prompts, self.cfg.train.eval_seed, *self.actors.rewards.args()
                )

            images, scores, work_s = call_with_restart(redo, pending.actor)
        waited = time.perf_counter() - t0
        per_prompt = self.cfg.train.eval_per_prompt
        values = pass_from_scores(scores)
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
            images,
            self.eval_prompts,
            per_prompt,
            title=f"iteration {pending.iteration} (weights v{pending.weights.version}), "
            "held-out prompts",
        )
        return {
            **row,
            "time/eval_s": waited,
            "time/eval_work_s": work_s,
        }

    def roll_out(self, it: int, weights: Published) -> list:
        """Each worker rolls out its share of the iteration's prompts and scores the
        leaves; a worker that dies is restarted by Ray and redoes its share."""
        P, workers = self.cfg.sampling.prompts_per_worker, self.actors.workers
        prompts = prompts_for(self.train_prompts, self.cfg.run.seed, it, P * len(workers))
        shares = [prompts[i * P : (i + 1) * P] for i in range(len(workers))]
        args = self.actors.rewards.args()
        refs = [w.rollout.remote(it, sh, *args) for w, sh in zip(workers, shares, strict=True)]
        results = []
        for i, ref in enumerate(refs):
            try:
                results.append(ray.get(ref))
            except ray.exceptions.RayActorError:

                def redo(actor, share=shares[i]):
                    ray.get(weights.load_on(actor))
                    return actor.rollout.remote(it, share, *self.actors.rewards.args())

                results.append(call_with_restart(redo, workers[i]))
        return results

    def learn(self, batches: list) -> dict:
        return ray.get(self.actors.learner.update.remote(*batches))

    def record(self, row: dict, last: bool) -> None:
        append_metrics(self.run_dir, row)
        if self.exporter is not None:
            self.exporter.observe(row)
        if self.status is not None:
            self.status.publish(row, self.run_dir, "finished" if last else "running")

    def checkpoint(self, done: int) -> None:
        ray.get(self.actors.learner.save.remote(str(checkpoint_path(self.run_dir, done))))
        prune_checkpoints(self.run_dir, self.cfg)
        draw_curves(self.run_dir, self.cfg.run.name)

    # ------------------------------------------------------------------ the loop
    def iteration(self, it: int, last: bool) -> dict:
        t0 = time.perf_counter()
        weights = self.publish()
        t1 = time.perf_counter()
        record_actors(self.run_dir, self.actors)  # outside the timed phases
        t1b = time.perf_counter()
        pending = self.evaluate(it, weights, last)
        if self.actors.evaluator is None:
            evaluation = self.collect_evaluation(pending)
        t2 = time.perf_counter()
        batches = self.roll_out(it, weights)
        t3 = time.perf_counter()
        stats = self.learn(batches)
        t4 = time.perf_counter()
        if self.actors.evaluator is not None:
            evaluation = self.collect_evaluation(pending)
        t5 = time.perf_counter()
        row = {"iteration": it, "version": weights.version, "weights_bytes": weights.nbytes}
        row.update(summarise_batches(batches, stats))
        self.budget.add(row["nfe_train"])
        row["nfe_train_total"] = self.budget.total
        row.update(evaluation)
        row["time/weight_push_s"] = t1 - t0
        row.setdefault("time/eval_s", 0.0)
        if self.actors.evaluator is None:
            row["time/eval_s"] = t2 - t1b
        row["time/rollout_s"] = max(b.timings["rollout_s"] for b in batches)
        row["time/reward_s"] = max(b.timings["reward_s"] for b in batches)
        row["time/rollout_and_reward_s"] = t3 - t2
        row["time/learn_s"] = t4 - t3
        row["time/iteration_s"] = (t5 - t0) - (t1b - t1)
        return row

    def run(self, start: int, end: int, progress: bool) -> int:
        """Iterations start..end-1 (fewer when the NFE budget runs out); returns the
        number of iterations done."""
        bar = tqdm(
            range(start, end),
            desc=f"train {self.cfg.run.name}",
            disable=not progress,
            initial=start,
            total=self.cfg.run.iterations,
        )
        done = start
        try:
            for it in bar:
                if self.budget.exhausted():
                    break
                last = it == end - 1 or self.budget.next_is_last()
                row = self.iteration(it, last)
                done = it + 1
                stop = done == end or self.budget.exhausted()
                self.record(row, stop)
                t = self.cfg.train
                if done % t.checkpoint_every == 0 or stop or done in t.checkpoint_at:
                    self.checkpoint(done)
                bar.set_postfix(progress_fields(row, self.cfg))
                if stop:
                    break
        except KeyboardInterrupt:
            self.checkpoint(done)
            print(
                f"\ninterrupted after iteration {done}; resume with: "
                f"g2rpo train --resume {self.run_dir}",
                file=sys.stderr,
            )
            raise
        return done


def _open_run(config, overrides, resume) -> tuple[G2RPOConfig, Path]:
    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / "config.yaml").is_file():
            raise ValueError(f"--resume {run_dir}: no config.yaml there (not a run directory)")
        return load_config(run_dir / "config.yaml", overrides), run_dir
    cfg = load_config(config, overrides)
    run_dir = Path(cfg.run.output_dir) / cfg.run.name
    if (run_dir / "metrics.jsonl").exists():
        raise ValueError(
            f"{run_dir} already holds a run: pass --resume {run_dir} or another run.name"
        )
    (run_dir / CKPT).mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    return cfg, run_dir


def train(
    config: str | Path | None,
    overrides: list[str],
    *,
    resume: str | Path | None = None,
    redis_url: str | None = None,
    progress: bool = True,
    max_iterations: int | None = None,
) -> Path:
    cfg, run_dir = _open_run(config, overrides, resume)
    cfg.model.check_trainable()  # before any actor loads a model
    t = cfg.train
    train_prompts = read_prompts(t.prompts, "train.prompts")
    eval_prompts = read_prompts(t.eval_prompts, "train.eval_prompts")[: t.eval_samples]
    eval_prompts = [p for p in eval_prompts for _ in range(t.eval_per_prompt)]
    actors = start_actors(cfg, redis_url)
    try:
        loop = TrainingLoop(cfg, run_dir, actors, train_prompts, eval_prompts)
        start = _resume_point(loop) if resume is not None else 0
        end = cfg.run.iterations
        if max_iterations is not None:
            end = min(end, start + max_iterations)
        _attach_telemetry(loop)
        try:
            done = loop.run(start, end, progress)
        finally:
            if loop.exporter is not None:
                loop.exporter.close()
        _finish(loop, start, done)
    finally:
        actors.stop()
    return run_dir


def _resume_point(loop: TrainingLoop) -> int:
    """Load the last checkpoint; keep the metrics and evaluations before it."""
    cfg, run_dir = loop.cfg, loop.run_dir
    ckpt = latest_checkpoint(run_dir)
    start = ray.get(loop.actors.learner.load.remote(str(ckpt))) if ckpt is not None else 0
    if start > cfg.run.iterations:
        raise ValueError(
            f"run.iterations={cfg.run.iterations}: the run's checkpoint is already at "
            f"iteration {start}; resume with --set run.iterations=N for N >= {start}"
        )
    rows = truncate_metrics(run_dir, start)
    if rows:
        loop.budget.total = rows[-1].get("nfe_train_total", 0)
        loop.budget.last = rows[-1].get("nfe_train", 0)
    evaluations = read_evaluations(run_dir)
    loop.first_eval = evaluations[0] if evaluations else None
    loop.last_eval_nfe = evaluations[-1]["nfe_train_total"] if evaluations else None
    return start


def _attach_telemetry(loop: TrainingLoop) -> None:
    if loop.cfg.train.metrics_port is not None:
        from .telemetry import TrainingExporter

        loop.exporter = TrainingExporter(loop.cfg.train.metrics_port, loop.cfg.train.metrics_host)
        (loop.run_dir / "metrics_port").write_text(f"{loop.exporter.port}\n")
    if loop.actors.rewards.redis_url:
        from .telemetry import RedisStatus

        loop.status = RedisStatus(loop.actors.rewards.redis_url, loop.cfg.run.name)


def _finish(loop: TrainingLoop, start: int, done: int) -> None:
    """A finished run (all iterations, or its NFE budget spent) exports its weights
    to final/ (or replaces them, when this session trained further) and says so."""
    cfg, run_dir = loop.cfg, loop.run_dir
    if done >= cfg.run.iterations:
        reason = "iterations"
    elif loop.budget.exhausted():
        reason = "nfe_budget"
    else:
        return  # stopped by --max-iterations: resumable, not finished
    if done > start or not (run_dir / "final").exists():
        export_final(loop.actors.learner, run_dir)
    if done > start or not (run_dir / "evals" / f"it_{done:05d}.json").exists():
        _evaluate_final(loop, done)
    mark_finished(run_dir, reason, done, loop.budget.total)


def _evaluate_final(loop: TrainingLoop, done: int) -> None:
    """The trained weights' own evaluation (evals/it_<done>.json), so that the
    reward-vs-NFE curve ends at the run's last NFE."""
    weights = loop.publish()
    pending = loop.evaluate(done, weights, last=True)
    loop.collect_evaluation(pending)
