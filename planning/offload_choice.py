"""``train.offload: auto`` resolved from the memory plan: what each side of a colocated
pair (``train.placement: colocated``) keeps on the host while the other has their GPU —
the least offload with which every moment of the pair's turn fits the GPU.

A pair's GPU holds, moment by moment (``PairMemory``, in bytes, from ``plan(cfg)``):

* the rollout: the worker's peak + what the learner rank keeps while idle (none: its
  weights and AdamW moments; optimizer: its weights; all: nothing);
* the update: the learner's peak + what the worker keeps while idle (none: its
  transformer and its residue, the text encoders and VAE; all: the residue);
* the handoff (``common/wire/ipc_handoff.py``): the learner's weights (it gathers) and its
  moments unless they went to the host first, the worker's transformer (it receives on
  the device) and residue, and one bucket;

each plus ``CONTEXTS`` (two CUDA contexts and NCCL's buffers, which the plan does not
count) and anything else in the pair (``beside``: a reward replica under
``train.reward.in_pairs``). Of the choices the config leaves open (``auto``), the one
that moves the fewest bytes per iteration and fits all three wins; when none fits,
everything moves (the plan's own verdict then says what does not fit)."""

from __future__ import annotations

from dataclasses import dataclass

from ..common.config.run import G2RPOConfig
from ..common.wire.ipc_handoff import BUCKET_BYTES

GiB = 2**30
# two processes' CUDA contexts and the learner group's NCCL buffers: the review of the
# one-node layout counts 2-3 GiB (../shared/docs/review-one-node.md)
CONTEXTS = 3 * GiB
LEARNER_CHOICES = ("none", "optimizer", "all")
WORKER_CHOICES = ("none", "all")


@dataclass(frozen=True)
class PairMemory:
    """A colocated pair's device memory, bytes."""

    gpu: int  # train.memory.gpu_memory_gib
    worker_peak: int  # the rollout's peak, the worker's own
    worker_transformer: int  # what train.offload.worker all moves
    worker_residue: int  # text encoders and VAE: they stay
    learner_peak: int  # the update's peak, the rank's own
    learner_weights: int  # what stays between updates besides the moments
    learner_moments: int  # AdamW's moments: what train.offload.learner optimizer moves
    bucket: int = BUCKET_BYTES
    beside: int = 0  # a reward replica in the pair, or anything else sharing the GPU
    contexts: int = CONTEXTS


@dataclass(frozen=True)
class OffloadChoice:
    learner: str
    worker: str
    fits: bool
    phases: dict[str, int]  # bytes at the rollout, the update, the handoff
    moved: int  # bytes to the host and back per iteration, each way

    def describe(self) -> str:
        phases = ", ".join(f"{k} {v / GiB:.1f}" for k, v in self.phases.items())
        verdict = "fits" if self.fits else "does not fit even with everything offloaded"
        return (
            f"train.offload learner={self.learner} worker={self.worker}: {phases} GiB on the "
            f"pair's GPU ({verdict}); {self.moved / GiB:.1f} GiB to the host and back"
        )


def learner_idle(m: PairMemory, learner: str) -> int:
    """What the learner rank keeps on the device while the worker rolls out."""
    return {"none": m.learner_weights + m.learner_moments, "optimizer": m.learner_weights}.get(
        learner, 0
    )


def worker_idle(m: PairMemory, worker: str) -> int:
    """What the worker keeps on the device while the learner rank updates."""
    return m.worker_residue + (m.worker_transformer if worker == "none" else 0)


def pair_phases(m: PairMemory, learner: str, worker: str) -> dict[str, int]:
    """Bytes on the pair's GPU at each moment of its turn (module docstring)."""
    extra = m.contexts + m.beside
    moments_at_handoff = m.learner_moments if learner == "none" else 0
    return {
        "rollout": m.worker_peak + learner_idle(m, learner) + extra,
        "update": m.learner_peak + worker_idle(m, worker) + extra,
        "handoff": m.learner_weights
        + moments_at_handoff
        + m.worker_transformer
        + m.worker_residue
        + m.bucket
        + extra,
    }


def moved_bytes(m: PairMemory, learner: str, worker: str) -> int:
    learner_moves = {"optimizer": m.learner_moments, "all": m.learner_moments + m.learner_weights}
    return learner_moves.get(learner, 0) + (m.worker_transformer if worker == "all" else 0)


def choose_offload(m: PairMemory, learner: str = "auto", worker: str = "auto") -> OffloadChoice:
    """The least offload that fits (module docstring); ``learner``, ``worker``: the
    config's values, a fixed one kept as it is."""
    options = [
        (moved_bytes(m, a, b), LEARNER_CHOICES.index(a), WORKER_CHOICES.index(b), a, b)
        for a in (LEARNER_CHOICES if learner == "auto" else (learner,))
        for b in (WORKER_CHOICES if worker == "auto" else (worker,))
    ]
    for moved, _, _, a, b in sorted(options):
        phases = pair_phases(m, a, b)
        if max(phases.values()) <= m.gpu:
            return OffloadChoice(a, b, True, phases, moved)
    a = "all" if learner == "auto" else learner
    b = "all" if worker == "auto" else worker
    return OffloadChoice(a, b, False, pair_phases(m, a, b), moved_bytes(m, a, b))


def pair_memory(cfg: G2RPOConfig) -> PairMemory:
    """The pair's figures from ``plan(cfg)`` (train.memory.gpu_memory_gib)."""
    from .estimate import plan
    from .pairs import (
        LEARNER_MOMENTS,
        LEARNER_WEIGHTS,
        WORKER_RESIDUE,
        WORKER_TRANSFORMER,
        part_bytes,
    )

    p = plan(cfg)
    by_kind = {a.actor: a for a in p.actors}
    worker, learner = by_kind["rollout worker"], by_kind["learner rank"]
    replica = by_kind.get("reward replica")
    beside = replica.peak if replica is not None and cfg.train.reward.in_pairs else 0
    return PairMemory(
        gpu=p.gpu_memory,
        worker_peak=worker.peak,
        worker_transformer=part_bytes(worker.parts, WORKER_TRANSFORMER),
        worker_residue=part_bytes(worker.parts, WORKER_RESIDUE),
        learner_peak=learner.peak,
        learner_weights=part_bytes(learner.parts, LEARNER_WEIGHTS),
        learner_moments=part_bytes(learner.parts, LEARNER_MOMENTS),
        beside=beside,
    )


def resolve_offload(cfg: G2RPOConfig) -> OffloadChoice | None:
    """The plan's choice for a colocated CUDA run whose ``train.offload`` leaves a side on
    ``auto``; None where there is nothing to choose (on a CPU nothing moves, and an
    unresolved ``auto`` moves everything, as before the plan chose)."""
    o, t = cfg.train.offload, cfg.train
    if t.placement != "colocated" or not cfg.model.device.startswith("cuda"):
        return None
    if "auto" not in (o.learner, o.worker):
        return None
    return choose_offload(pair_memory(cfg), o.learner, o.worker)


def with_offload_chosen(cfg: G2RPOConfig) -> G2RPOConfig:
    """``cfg`` with ``train.offload``'s ``auto`` sides replaced by the plan's choice (the
    config the actors are started with; the run's config.yaml keeps ``auto``)."""
    choice = resolve_offload(cfg)
    if choice is None:
        return cfg
    offload = cfg.train.offload.model_copy(
        update={"learner": choice.learner, "worker": choice.worker}
    )
    train = cfg.train.model_copy(update={"offload": offload})
    return cfg.model_copy(update={"train": train})
