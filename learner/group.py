"""The learner group as the driver sees it: ``train.learner.count`` Learner actors that
act as one. Every call goes to every rank (sharded weights are gathered, gradients
and statistics reduced, checkpoints written by all of them together) and the
group's answer is rank 0's. A rank that fails fails the call at once, naming it,
rather than leaving the others waiting in a collective."""

from __future__ import annotations

import ray

from ..common.config import G2RPOConfig
from .actors import Learner
from .trainer import uses_process_group


class LearnerGroup:
    def __init__(self, cfg: G2RPOConfig, options: dict) -> None:
        self.cfg = cfg
        n, cfg_dict = cfg.train.learner.count, cfg.model_dump(mode="json")
        self.ranks = [Learner.options(**options).remote(cfg_dict, r, n) for r in range(n)]

    @property
    def rank0(self):
        return self.ranks[0]

    def form(self) -> None:
        """Join the ranks into one torch.distributed group (placed actors only)."""
        if uses_process_group(self.cfg):
            address = ray.get(self.rank0.meeting_address.remote())
            self._gather([r.join.remote(address) for r in self.ranks], "join")

    def ready_refs(self) -> list:
        return [r.ready.remote() for r in self.ranks]

    def placement_refs(self) -> list:
        return [r.placement.remote() for r in self.ranks]

    def _gather(self, refs: list, what: str) -> list:
        """Every rank's answer; the first rank to fail raises at once."""
        pending = dict(zip(refs, range(len(refs)), strict=True))
        answers: list = [None] * len(refs)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            rank = pending.pop(done[0])
            try:
                answers[rank] = ray.get(done[0])
            except ray.exceptions.RayError as exc:
                if len(refs) == 1:
                    raise
                raise RuntimeError(f"learner rank {rank} failed in {what}: {exc}") from exc
        return answers

    def _call(self, method: str, *args):
        refs = [getattr(r, method).remote(*args) for r in self.ranks]
        return self._gather(refs, method)[0]

    def publish(self):
        """(version, [object ref], checksum, bytes) of the current weights."""
        return self._call("publish")

    def stage_weights(self):
        """(version, layout, checksum, bytes) of the current weights, kept by rank 0
        for a broadcast."""
        return self._call("stage_weights")

    def update(self, batches: list) -> dict:
        # one object per batch, shared by every rank (each recomputes its share)
        args = [ray.put(b) for b in batches] if len(self.ranks) > 1 else batches
        return self._call("update", *args)

    def save(self, path: str) -> None:
        self._call("save", path)

    def load(self, path: str) -> int:
        return self._call("load", path)

    def export(self, directory: str) -> str:
        return self._call("export", directory)

    def kill(self) -> None:
        for rank in self.ranks:
            ray.kill(rank, no_restart=True)
