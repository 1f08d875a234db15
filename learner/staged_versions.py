"""Learner rank 0's published weight versions, kept for the workers that may still load
them (the collective transport's broadcast source and object-store fallback)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..common.wire.shared_tensors import from_wire
from ..common.wire.weights import publishable

if TYPE_CHECKING:
    import ray


def versions_kept(staleness: int) -> int:
    """The versions learner rank 0 must still be able to hand out: the newest, and
    with overlapped iterations (``train.weights.staleness >= 1``) the one the rollout in
    flight was started with, which a worker restarted during it reloads
    (``driver.collect_rollout``). The driver overlaps one iteration at most, whatever
    the bound, so no older version is ever asked for."""
    return 2 if staleness >= 1 else 1


class StagedVersions:
    """Learner rank 0's weight versions for the collective transport, each held once
    in host memory: as tensors for the broadcast, then, once an actor outside the
    broadcast needs it (a restarted worker, the evaluator, the fallback), as its
    object-store copy alone (the tensors are dropped when it is put): ``publishable``'s
    NumPy form, which every worker of a node maps, as on the object-store transport."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._held: dict[int, dict | ray.ObjectRef] = {}

    def add(self, version: int, state: dict) -> None:
        self._held[version] = state
        for old in sorted(self._held)[: -self.keep]:
            del self._held[old]

    def versions(self) -> list[int]:
        return sorted(self._held)

    def state(self, version: int) -> dict:
        import ray  # here: versions_kept serves `g2rpo plan`, which runs without Ray

        held = self._held[version]
        # a put version: views of the store's copy (read-only; the broadcast only reads)
        return from_wire(ray.get(held)) if isinstance(held, ray.ObjectRef) else held

    def object_ref(self, version: int) -> ray.ObjectRef:
        import ray

        held = self._held[version]
        if not isinstance(held, ray.ObjectRef):
            held = self._held[version] = ray.put(publishable(held))
        return held
