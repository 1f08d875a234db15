"""The learner group as the driver sees it: ``train.learner.count`` Learner actors that
act as one. Every call goes to every rank (sharded weights are gathered, gradients
and statistics reduced, checkpoints written by all of them together) and the
group's answer is rank 0's. A rank that fails fails the call at once, naming it,
rather than leaving the others waiting in a collective: the group is broken then,
so every rank is stopped and every rank's answer collected (none is left for Ray
to report as an unhandled error). A rank whose process died raises
``LearnerRankDied``, which the driver may recover from (``run.max_failures``)."""

from __future__ import annotations

import contextlib
import re

import ray

from ..common.config.run import G2RPOConfig
from ..common.wire.messages import PublishedWeights
from .actor import Learner
from .trainer import sharded_learner, uses_process_group

# after one rank failed, how long the others may take to answer before they are
# stopped (a rank that died is told apart from one that saw its peer go)
SETTLE_S = 10.0


class LearnerRankDied(RuntimeError):
    """A learner rank's process died (killed, out of host memory, its node lost).
    The group is stopped; a new one can continue from the last checkpoint."""

    def __init__(self, rank: int, what: str, cause: BaseException) -> None:
        pid = re.search(r"\bpid: (\d+)", str(cause))
        where = f" (pid {pid[1]})" if pid else ""
        super().__init__(f"learner rank {rank}{where} died in {what}")
        self.rank, self.what = rank, what


class LearnerGroup:
    def __init__(self, cfg: G2RPOConfig, options: dict, ranks: list | None = None) -> None:
        """New ranks placed by ``options``, or ``ranks`` kept from an earlier run
        (orchestration/warm_actors.py), which the caller has reconfigured."""
        self.cfg, self.options = cfg, options
        n, cfg_dict = cfg.train.learner.count, cfg.model_dump(mode="json")
        if ranks is None:
            ranks = [Learner.options(**options).remote(cfg_dict, r, n) for r in range(n)]
        self.ranks = ranks

    @property
    def rank0(self):
        return self.ranks[0]

    def form(self) -> None:
        """Join the ranks into one torch.distributed group (placed actors only). A
        sharded group's ranks first read their transformer (``Learner.prepare``:
        rank 0 reads the whole of it, which takes minutes at FLUX scale on shared
        storage), and the group forms once every rank has: the others wait for rank 0
        here, not in the group's first collective (sharding, in ``ready()``), which
        would time out."""
        if sharded_learner(self.cfg):
            self._gather([r.prepare.remote() for r in self.ranks], "prepare")
        if uses_process_group(self.cfg):
            address = ray.get(self.rank0.meeting_address.remote())
            self._gather([r.join.remote(address) for r in self.ranks], "join")

    def ready_refs(self) -> list:
        return [r.ready.remote() for r in self.ranks]

    def placement_refs(self) -> list:
        return [r.placement.remote() for r in self.ranks]

    def _gather(self, refs: list, what: str) -> list:
        """Every rank's answer; the first rank to fail raises at once (the others are
        stopped): ``LearnerRankDied`` when a rank's process died."""
        pending = dict(zip(refs, range(len(refs)), strict=True))
        answers: list = [None] * len(refs)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            rank = pending.pop(done[0])
            try:
                answers[rank] = ray.get(done[0])
            except ray.exceptions.RayError as exc:
                if len(refs) == 1:
                    if isinstance(exc, ray.exceptions.RayActorError):
                        raise LearnerRankDied(rank, what, exc) from exc
                    raise
                failed = {rank: exc, **self._stop(pending)}
                died = [r for r, e in failed.items() if isinstance(e, ray.exceptions.RayActorError)]
                if died:
                    raise LearnerRankDied(min(died), what, failed[min(died)]) from exc
                raise RuntimeError(f"learner rank {rank} failed in {what}: {exc}") from exc
        return answers

    def _stop(self, pending: dict) -> dict:
        """After one rank failed: the other ranks' errors, those that come within
        SETTLE_S (a peer's death reaches the survivors as a collective error), then
        every rank stopped and every answer collected."""
        failed = {}
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=SETTLE_S)
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayError as exc:
                failed[pending[ref]] = exc
        self.kill()
        for ref in pending:
            if ref not in ready:
                # stopped by us: not this failure's cause
                with contextlib.suppress(ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
                    ray.get(ref, timeout=SETTLE_S)
        return failed

    def _call(self, method: str, *args):
        refs = [getattr(r, method).remote(*args) for r in self.ranks]
        return self._gather(refs, method)[0]

    def publish(self) -> PublishedWeights:
        """The current weights, put into the object store by rank 0."""
        return self._call("publish")

    def handoff(self, workers: list, peers: list) -> list:
        """Colocated: rank i hands the current version to ``workers[i]`` inside their GPU
        (``peers[i]``: that worker's ``handoff_peer()`` or None); every rank's answer."""
        pairs = zip(self.ranks, workers, peers, strict=True)
        return self._gather([r.handoff.remote(w, p) for r, w, p in pairs], "handoff")

    def put_version(self, version: int) -> PublishedWeights:
        """The current weights (``version``) put into the object store by rank 0."""
        return self._call("put_version", version)

    def stage_weights(self) -> PublishedWeights:
        """The current weights, kept by rank 0 for a broadcast (with their layout)."""
        return self._call("stage_weights")

    def update(self, batches: list) -> dict:
        return self.finish(self.start_update(batches), "update")

    def start_update(self, batches: list) -> list:
        """Send the update to every rank; ``finish`` waits for it. ``batches``: the
        workers' trajectories or refs to them (fetched by each rank from the worker's
        node, never through the driver)."""
        # one object per batch, shared by every rank (each recomputes its share)
        args = [b if isinstance(b, ray.ObjectRef) else ray.put(b) for b in batches]
        return [r.update.remote(*args) for r in self.ranks]

    def finish(self, refs: list, what: str):
        """The group's answer to calls sent to every rank (rank 0's)."""
        return self._gather(refs, what)[0]

    def save(self, path: str) -> None:
        self._call("save", path)

    def load(self, path: str) -> int:
        return self._call("load", path)

    def export(self, directory: str) -> str:
        return self._call("export", directory)

    def kill(self) -> None:
        for rank in self.ranks:
            ray.kill(rank, no_restart=True)
