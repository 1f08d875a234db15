"""The training loop's bookkeeping (``Bookkeeping``, a base of driver.TrainingLoop): an
iteration once its update is sent (``Step``); its metrics row counted and recorded
(metrics file, exporter, status); the learner group's checkpoints written, checked and
pruned (with curves.png); and after a stop, the iteration whose update was under way
finished before the last checkpoint."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import ray

from ..common.errors import RunFailed
from ..learner.checkpoints import complete
from ..learner.trainer import sharded_learner
from ..run_directory.files import (
    append_metrics,
    checkpoint_path,
    draw_curves,
    prune_checkpoints,
    record_checkpoint,
    replace_other_layout,
)
from ..run_directory.healthy import kept_for_health
from .evaluations import PendingEval
from .phase_clock import PhaseClock
from .publishing import Published
from .records import iteration_row

CURVES_EVERY_S = 60.0


@dataclass
class Step:
    """An iteration from the moment its update was sent to the learner group: what
    its metrics row needs. A stop (Ctrl-C, SIGTERM) that lands from then on finishes
    it (the ranks are applying the update anyway) before checkpointing, so the
    checkpoint is named by the iteration the learner really reached and no row is
    missing on resume."""

    iteration: int
    weights: Published  # the version the batch was sampled with
    summaries: list
    update: list  # the ranks' update refs
    evaluation: PendingEval | dict | None  # pending, or its row entries once collected
    clock: PhaseClock
    stats: dict | None = None


class Bookkeeping:
    """What TrainingLoop records between its phases; it reads the loop's fields (cfg,
    run_dir, actors, budget, publisher, exporter, status, step, ...)."""

    def record(self, row: dict, last: bool) -> None:
        append_metrics(self.run_dir, row)
        if self.exporter is not None:
            self.exporter.observe(row)
        if self.status is not None:
            self.status.publish(row, self.run_dir, "finished" if last else "running")

    def checkpoint(self, done: int, last: bool = False) -> None:
        """The learner group's checkpoint after ``done`` iterations, checked to be the
        learner's own iteration and to have reached the run directory as the driver
        sees it (else the run stops naming run.output_dir: shared_dir.py), then
        recorded, so a resume that cannot find it stops instead of starting over."""
        self.at("checkpoint", done)
        at = ray.get(self.actors.learner.rank0.iteration.remote())
        if at != done:  # a checkpoint named for another iteration would skip or redo one
            raise RuntimeError(f"checkpoint of iteration {done}: the learner is at {at}")
        sharded = sharded_learner(self.cfg)
        replace_other_layout(self.run_dir, done, sharded)
        path = checkpoint_path(self.run_dir, done, sharded)
        self.actors.learner.save(str(path))
        if not complete(path):
            raise RunFailed(
                f"run.output_dir: the learner group saved {path.name}, but the driver does not "
                f"see it whole in {path.parent}: the run directory must be one filesystem for "
                "the driver and every node (README, 'What the cluster must provide')"
            )
        record_checkpoint(self.run_dir, path)
        self.checkpointed_at = time.monotonic()
        self.at("checkpointed", done)
        prune_checkpoints(self.run_dir, self.cfg, also_keep=kept_for_health(self.run_dir))
        # curves.png at the session's last checkpoint, and at most once a minute before:
        # a redraw is 0.5 s of driver time on 2 cores, a quarter of a tiny-world iteration
        now = time.monotonic()
        if last or now - self.curves_drawn_at >= CURVES_EVERY_S:
            draw_curves(self.run_dir, self.cfg.run.name)
            self.curves_drawn_at = now

    def summary(self, step: Step) -> dict:
        """The iteration's metrics row (records.iteration_row), its NFEs counted."""
        row = iteration_row(step, self.publisher.counters(), self.learner_restarts)
        self.budget.add(row["nfe_train"])
        row["nfe_train_total"] = self.budget.total
        return row

    def finish_interrupted(self, done: int) -> int:
        """After a stop: an iteration whose update was already sent is finished and
        recorded (its ranks apply the update whatever the driver does, so a checkpoint
        now holds iteration ``done + 1``); returns the iterations done. A second stop
        while it finishes leaves without a checkpoint (the last one stays)."""
        step = self.step
        if step is None:
            return done
        print(
            f"\nstopping: finishing iteration {step.iteration} (its update is under way) "
            "before the checkpoint; stop again to leave without one",
            file=sys.stderr,
        )
        try:
            row = self.finish_step(step)
        except KeyboardInterrupt:
            print("stopped again: no checkpoint written", file=sys.stderr)
            raise
        self.record(row, last=False)
        return step.iteration + 1
