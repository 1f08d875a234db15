"""A colocated pair's GPU (``train.placement: colocated``), phase by phase: learner rank
i and rollout worker i take it in turns, each phase's peak its active side's plus what
the other leaves there (``train.offload``), and a reward replica in the pair
(``train.reward.in_pairs``) beside both."""

from __future__ import annotations

from typing import Protocol

GiB = 2**30


class ActorPlan(Protocol):
    """What this module reads and sets of planning/estimate.py's ActorPlan."""

    parts: dict[str, int]
    budget: int
    notes: list[str]

    @property
    def peak(self) -> int: ...


# what a colocated rollout worker keeps on the GPU while its learner rank updates
# (rollout_worker/worker.py: only the transformer goes to the host)
WORKER_RESIDUE = (
    "VAE weights",
    "CLIP text encoder weights",
    "CLIP-G text encoder weights",
    "T5 encoder weights",
)
# the learner rank's parts that stay between updates (gradients, activations and FSDP's
# buffers are freed after each): what train.offload.learner keeps on the device while
# idle (none: both; optimizer: the weights), and the worker's that train.offload.worker
# none keeps there; the plan's names (planning/estimate.py)
LEARNER_WEIGHTS = ("weights (float32 master", "base weights", "LoRA adapters", "KL reference")
LEARNER_MOMENTS = ("AdamW states",)
WORKER_TRANSFORMER = ("transformer weights", "transformer buffers", "LoRA adapters")


def part_bytes(parts: dict[str, int], prefixes: tuple[str, ...]) -> int:
    """The bytes of the parts whose names start with one of ``prefixes``."""
    return sum(v for k, v in parts.items() if k.startswith(prefixes))


def learner_keeps(learner: ActorPlan, offload: str) -> int:
    """What the learner rank keeps on the device while its worker rolls out
    (``train.offload.learner``; auto, unresolved: nothing, as all)."""
    weights = part_bytes(learner.parts, LEARNER_WEIGHTS)
    moments = part_bytes(learner.parts, LEARNER_MOMENTS)
    return {"none": weights + moments, "optimizer": weights}.get(offload, 0)


def worker_keeps(worker: ActorPlan, offload: str) -> int:
    """What the worker keeps on the device, besides its residue, while its learner rank
    updates (``train.offload.worker``; auto, unresolved: nothing, as all)."""
    return part_bytes(worker.parts, WORKER_TRANSFORMER) if offload == "none" else 0


def take_turns(
    worker: ActorPlan,
    learner: ActorPlan,
    gpu_memory: int,
    replica: ActorPlan | None = None,
    offload_learner: str = "auto",
    offload_worker: str = "auto",
) -> None:
    """The colocated layout's per-phase budgets: rank i and worker i share one GPU in
    turns, so each phase's peak is its active side's peak plus what the other leaves on
    the device: the learner what ``train.offload.learner`` keeps (auto, unresolved: none
    of its tensors, planning/offload_choice.py resolves it to what fits), the worker its
    text encoders and VAE and, under ``train.offload.worker`` none, its transformer; the
    GPU fits when both phases do. A reward replica in the pair (``train.reward.in_pairs``)
    holds its scorer and a scoring batch on that GPU through both phases: each side's
    budget is less it, and it fits where both do."""
    residue = {k: v for k, v in worker.parts.items() if k.startswith(WORKER_RESIDUE)}
    kept_by_learner = learner_keeps(learner, offload_learner)
    kept_by_worker = worker_keeps(worker, offload_worker)
    scorer = replica.peak if replica is not None else 0
    worker.budget = gpu_memory - kept_by_learner - scorer
    learner.budget = gpu_memory - sum(residue.values()) - kept_by_worker - scorer
    left = ", ".join(f"{k} {v / GiB:.1f}" for k, v in residue.items())
    if kept_by_worker:
        left += f", its transformer {kept_by_worker / GiB:.1f} (train.offload.worker none)"
    beside = f" and the pair's reward replica ({scorer / GiB:.1f} GiB)" if scorer else ""
    waits = (
        f"keeps {kept_by_learner / GiB:.1f} GiB there (train.offload.learner {offload_learner})"
        if kept_by_learner
        else "waits on the host"
    )
    worker.notes.append(
        f"colocated: the rollout phase has the GPU (its learner rank {waits})"
        + (f" less the pair's reward replica ({scorer / GiB:.1f} GiB)" if scorer else "")
    )
    learner.notes.append(
        f"colocated: the learn phase has the GPU less the rollout worker's residue ({left} GiB)"
        + beside
    )
    if replica is not None:
        # it fits where both phases do: its budget is the room the tighter one leaves it
        replica.budget = scorer + min(worker.budget - worker.peak, learner.budget - learner.peak)
        replica.notes.append(
            "in a colocated pair's GPU (train.reward.in_pairs): counted in the rollout "
            "worker's and the learner rank's budgets"
        )
    for a in (worker, learner):
        a.notes.append("plus each process's CUDA context, which this plan does not count")
