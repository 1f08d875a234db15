"""Actors kept warm between the runs of one driver process.

Most of starting a run's actors is each new process importing torch, diffusers and
transformers (about 8 CPU-seconds an actor here; 12.6 s of a 17-s one-iteration run
on 2 cores went to starting 3 actors). A process that trains runs one after another
(a notebook, the test suite) can keep them: ``train(..., warm=WarmActors())`` takes
the rollout workers, the evaluator and the learner ranks a finished run left, where
their Ray resources are those the next run asks, and reconfigures each in its own
process (out of every group; its pipeline or model loaded again from the new config
on first use). Reward replicas stay the run's own. A run that fails stops its actors
as without a pool: only a run that ended normally gives them back. Kept actors a run
does not take (a learner group of the other size) stay while the cluster has room
for the run's new actors beside them, so runs that alternate between one and two
learners each find their group warm; they are stopped as soon as room is short.

Ray restarts a dead rollout worker with the arguments it was *created* with, which
for a kept one are an earlier run's config. So a kept worker reads its config, at
every start, from the pool's board (a small actor holding what the current run set
for each slot). Learner ranks are never restarted by Ray (the driver forms a new
group), so they need no board."""

from __future__ import annotations

import itertools
import json
import uuid
from dataclasses import dataclass

import ray

from ..rollout_worker.actor import RolloutWorker

# how long a kept actor may take to answer ``reconfigure`` (a restarting one is
# waited for) before it is replaced by a new one
RECONFIGURE_TIMEOUT_S = 120.0


@ray.remote(num_cpus=0, max_restarts=0)
class ConfigBoard:
    """slot → (config dict, worker index) of the run now using that kept worker."""

    def __init__(self) -> None:
        self.slots: dict[str, tuple[dict, int]] = {}

    def set(self, slot: str, cfg: dict, worker: int) -> None:
        self.slots[slot] = (cfg, worker)

    def get(self, slot: str) -> tuple[dict, int]:
        return self.slots[slot]


@dataclass
class _Kept:
    options: str  # the Ray options it was placed with, as canonical JSON
    handle: object
    slot: str


def _ray_session() -> tuple[str, str]:
    """This driver's job on this Ray (a new local Ray numbers its jobs from 1 again,
    so its node's id tells them apart)."""
    context = ray.get_runtime_context()
    return context.get_node_id(), context.get_job_id()


def _key(options: dict) -> str:
    return json.dumps(options, sort_keys=True, default=str)


def _learner_key(cfg, options: dict) -> str:
    """A kept learner group serves a run asking the same options, group size and
    placement strategy (its bundles are made of those)."""
    learner = cfg.train.learner
    return _key({**options, "world": learner.count, "strategy": learner.placement_strategy})


class WarmActors:
    """The pool: after ``start_run``, ``rollout_workers`` and ``learner_group`` hand
    out kept actors first (new ones for the rest); ``keep`` takes a finished run's
    back; ``close`` stops them all."""

    def __init__(self) -> None:
        self._session = None
        self._board = self._board_name = None
        self._slots = itertools.count()
        self._free: list[_Kept] = []
        self._in_use: dict[int, _Kept] = {}  # id(handle) → entry, this run's workers
        # options + group size + placement → (ranks, their placement group)
        self._free_learners: dict[str, tuple[list, object]] = {}
        self.started: list[dict] = []  # the options of the actors this run started new

    def start_run(self) -> None:
        """A run begins taking actors. Those of another Ray session are forgotten
        (they died with it); those a failed run held were stopped with it."""
        session = _ray_session()
        if session != self._session:
            # named: workers find it by name (an actor handle among their creation
            # arguments would be an object Ray must keep for their restarts)
            self._board_name = f"g2rpo-config-board-{uuid.uuid4().hex[:12]}"
            self._board = ConfigBoard.options(name=self._board_name).remote()
            self._session, self._free, self._free_learners = session, [], {}
        self._in_use, self.started = {}, []

    def holds_unused(self) -> bool:
        return bool(self._free or self._free_learners)

    def release_unused(self, needed: dict[str, float] | None = None) -> None:
        """Stop the kept actors this run did not take, which hold resources the run's
        new actors may need. With ``needed`` (the Ray resources of the actors the run
        started new), only when the cluster has less than that free: counted after
        those actors were asked for, so any already placed count twice, and the doubt
        goes to stopping."""
        if needed is not None:
            free = ray.available_resources()
            if all(free.get(name, 0.0) >= amount for name, amount in needed.items()):
                return
        for entry in self._free:
            ray.kill(entry.handle, no_restart=True)
        for ranks, pg in self._free_learners.values():
            for r in ranks:
                ray.kill(r, no_restart=True)
            ray.util.remove_placement_group(pg)
        self._free, self._free_learners = [], {}

    def rollout_workers(self, cfg: dict, indices: list[int], options: dict) -> list:
        """Rollout workers (index -1: the evaluator) for the run configured by ``cfg``:
        kept ones placed with the same ``options`` first, reconfigured; new ones for
        the rest (and for any kept one that does not answer)."""
        key = _key(options)
        handles = []
        for index in indices:
            entry = next((k for k in self._free if k.options == key), None)
            if entry is not None:
                self._free.remove(entry)
                ray.get(self._board.set.remote(entry.slot, cfg, index))
                if not self._reconfigured(entry.handle.reconfigure.remote(cfg, index)):
                    ray.kill(entry.handle, no_restart=True)
                    entry = None
            if entry is None:
                slot = f"worker-{next(self._slots)}"
                ray.get(self._board.set.remote(slot, cfg, index))
                handle = RolloutWorker.options(**options).remote(cfg, index, self._board_name, slot)
                entry = _Kept(key, handle, slot)
                self.started.append(options)
            self._in_use[id(entry.handle)] = entry
            handles.append(entry.handle)
        return handles

    def learner_group(self, cfg, options: dict):
        """(LearnerGroup, its placement group) of kept ranks of a group of the size
        ``cfg`` asks, placed with ``options`` and the same bundles, reconfigured for
        ``cfg``; None when there are none (or one does not answer)."""
        from ..learner.group import LearnerGroup

        world, cfg_dict = cfg.train.learner.count, cfg.model_dump(mode="json")
        kept = self._free_learners.pop(_learner_key(cfg, options), None)
        if kept is None:
            return None
        ranks, pg = kept
        refs = [r.reconfigure.remote(cfg_dict, i, world) for i, r in enumerate(ranks)]
        if all(self._reconfigured(ref) for ref in refs):
            return LearnerGroup(cfg, options, ranks), pg
        for r in ranks:
            ray.kill(r, no_restart=True)
        ray.util.remove_placement_group(pg)
        return None

    @staticmethod
    def _reconfigured(ref) -> bool:
        try:
            ray.get(ref, timeout=RECONFIGURE_TIMEOUT_S)
            return True
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            return False

    def keep(self, actors) -> None:
        """A run that ended normally: its reward replicas closed, its workers,
        evaluator and learner ranks kept for the next run."""
        if actors.rewards is not None:
            actors.rewards.close()
        for handle in [*actors.workers, actors.evaluator]:
            entry = self._in_use.pop(id(handle), None) if handle is not None else None
            if entry is not None:
                self._free.append(entry)
            elif handle is not None:  # not one of ours: not kept
                ray.kill(handle, no_restart=True)
        if actors.learner is not None:
            key = _learner_key(actors.learner.cfg, actors.learner.options)
            self._free_learners[key] = (list(actors.learner.ranks), actors.learner_pg)

    def close(self) -> None:
        """Stop every kept actor and the board (nothing to do once Ray is shut down)."""
        if ray.is_initialized() and _ray_session() == self._session:
            self.release_unused()
            if self._board is not None:
                ray.kill(self._board, no_restart=True)
        self._free, self._in_use, self._free_learners, self._board = [], {}, {}, None
