"""A learner group that lost a rank, recovered inside the run (``run.max_failures``),
as Ray Train's ``FailureConfig(max_failures=…)`` does: when a learner rank's
process dies, the group stops (every rank, quietly: ``LearnerGroup`` collects
every rank's answer), one line says so, a new group is formed and loads the last
checkpoint exactly as ``g2rpo train --resume`` does (``lifecycle.resume_point``:
metrics.jsonl and the evaluations after it are dropped, the NFE budget and the
first evaluation restored), and the loop goes on from there. Everything an
iteration draws is a pure function of (seed, iteration, worker) and a checkpoint
loads exactly, so the run reproduces the uninterrupted one; at most
``train.checkpoints.every`` iterations are redone. One failure more than
``run.max_failures`` in a session stops the run with a line that says how to
resume it. Each recovery is counted in the rows (``learner_restarts``, from the
first recovery on, over the whole run) and described in ``learner_failures.jsonl``.

Only a rank's *death* is recovered (killed, out of host memory, its node lost): an
exception raised inside a rank (a bug, a collective timeout) still stops the run."""

from __future__ import annotations

import json
import sys
import time

import ray

from ..common.errors import RunFailed
from ..learner.group import LearnerRankDied
from ..run_directory.files import read_metrics
from .budget import Budget
from .cluster import new_learner_group
from .lifecycle import resume_point
from .placement import wait_placed

FAILURES_FILE = "learner_failures.jsonl"


def run_with_recovery(loop, start: int, end: int, progress: bool) -> int:
    """``loop.run(start, end)``, forming the learner group again from the last
    checkpoint whenever a rank dies, up to ``run.max_failures`` times."""
    allowed, failures, died = loop.cfg.run.max_failures, 0, None
    while True:
        try:
            if died is not None:
                start = reform(loop, died)
                died = None
            return loop.run(start, end, progress)
        except LearnerRankDied as exc:
            died = exc
        except ray.exceptions.RayActorError as exc:
            # a learner call outside the group's own (e.g. a broadcast's sender)
            rank = _learner_rank(loop, exc)
            if rank is None:
                raise
            died = LearnerRankDied(rank, "a call", exc)
        failures += 1
        if failures > allowed:
            raise RunFailed(
                f"{died}; the learner group was stopped (run.max_failures={allowed}: "
                f"{failures - 1} recovered in this session): resume with "
                f"g2rpo train --resume {loop.run_dir}"
            ) from None
        print(
            f"{died}; the learner group was stopped: forming it again from the last "
            f"checkpoint (failure {failures} of run.max_failures={allowed})",
            file=sys.stderr,
        )


def reform(loop, died: LearnerRankDied) -> int:
    """A new learner group in place of the broken one, loaded from the last
    checkpoint; returns the iteration to go on from."""
    cfg, t, run_dir = loop.cfg, loop.cfg.train, loop.run_dir
    rows = read_metrics(run_dir) if (run_dir / "metrics.jsonl").exists() else []
    loop.actors.learner.kill()  # already stopped; kill is idempotent
    options = t.ray_options(t.learner)
    # in the same bundles: the group stays packed where it was (they free as the old
    # ranks' processes end; the new ones wait for them)
    loop.actors.learner = new_learner_group(cfg, options, loop.actors.learner_pg)
    wait_placed(
        [
            (
                "train.learner (num_cpus/num_gpus/resources)",
                loop.actors.learner.ranks,
                options,
            )
        ],
        t.placement_timeout_s,
    )
    loop.actors.learner.form()
    ray.get(loop.actors.learner.ready_refs())
    # the new rank 0 holds no weight-broadcast group: form one before the next version
    if getattr(loop.publisher, "name", None) is not None:
        loop.publisher.name = None
    # staleness >= 1: a rollout started beside the failed update is not used; nor is the
    # failed iteration's update (a stop now must not wait for it)
    loop.next_rollout, loop.published, loop.step = None, None, None
    loop.budget = Budget(cfg.run.nfe_budget)
    restarts = loop.learner_restarts + 1
    start = resume_point(loop)
    loop.learner_restarts = restarts
    event = {
        "time": time.time(),
        "rank": died.rank,
        "in": died.what,
        "error": str(died),
        "last_iteration_recorded": rows[-1]["iteration"] if rows else None,
        "resumed_from": start,
        "learner_restarts": restarts,
    }
    with (run_dir / FAILURES_FILE).open("a") as f:
        f.write(json.dumps(event) + "\n")
    print(f"learner group formed again; going on from iteration {start}", file=sys.stderr)
    return start


def _learner_rank(loop, exc: ray.exceptions.RayActorError) -> int | None:
    """The learner rank ``exc`` says died, if it is one."""
    actor_id = getattr(exc, "actor_id", None)
    if actor_id is None or loop.actors.learner is None:
        return None
    for rank, handle in enumerate(loop.actors.learner.ranks):
        if handle._actor_id.hex() == actor_id:
            loop.actors.learner.kill()  # the group is broken without it
            return rank
    return None
