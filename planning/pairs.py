"""A colocated pair's GPU (``train.placement: colocated``), phase by phase: learner rank
i and rollout worker i take it in turns, each phase's peak its active side's plus what
the other leaves there, and a reward replica in the pair (``train.reward.in_pairs``)
beside both."""

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


def take_turns(
    worker: ActorPlan, learner: ActorPlan, gpu_memory: int, replica: ActorPlan | None = None
) -> None:
    """The colocated layout's per-phase budgets: rank i and worker i share one GPU in
    turns, so each phase's peak is its active side's peak plus what the other leaves on
    the device. The learner leaves none of its tensors (all go to the host), the worker
    its text encoders and VAE; the GPU fits when both phases do. A reward replica in
    the pair (``train.reward.in_pairs``) holds its scorer and a scoring batch on that GPU
    through both phases: each side's budget is less it, and it fits where both do."""
    residue = {k: v for k, v in worker.parts.items() if k.startswith(WORKER_RESIDUE)}
    scorer = replica.peak if replica is not None else 0
    worker.budget = gpu_memory - scorer
    learner.budget = gpu_memory - sum(residue.values()) - scorer
    left = ", ".join(f"{k} {v / GiB:.1f}" for k, v in residue.items())
    beside = f" and the pair's reward replica ({scorer / GiB:.1f} GiB)" if scorer else ""
    worker.notes.append(
        "colocated: the rollout phase has the GPU (its learner rank waits on the host)"
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
