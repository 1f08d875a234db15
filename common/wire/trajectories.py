"""What a rollout worker hands the learner: the trained SDE steps (``Transitions``)
and one worker's rollout of its prompts (``Trajectories``). The contract between the
rollout workers and the learner; both import it from here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from ..algorithms.rollout_plan import RolloutPlan
from .shared_tensors import SharedWhenPickled


@dataclass
class Transitions(SharedWhenPickled):
    """The trained SDE steps of a rollout, as the learner needs them.

    States are deduplicated: in G²RPO the G members of a group share their anchor
    state x_k, so the learner runs one forward per (prompt, k).
    """

    states: torch.Tensor  # [S, ...] distinct x_t
    state_step: torch.Tensor  # [S] grid index t of each state
    state_prompt: torch.Tensor  # [S] prompt (conditioning row) of each state
    next_samples: torch.Tensor  # [M, ...] x_{t'} drawn by the SDE step (fp32)
    next_step: torch.Tensor  # [M] grid index t' reached
    old_log_probs: torch.Tensor  # [M]
    state_index: torch.Tensor  # [M] row of ``states`` each transition starts from
    adv_slot: torch.Tensor  # [M] flat index into the plan's advantage tensor
    old_means: torch.Tensor | None = None  # [M, ...] μ_old of each step (plan.keep_means)
    noise_scale: torch.Tensor | None = None  # [M] std multiplier of each step (None: all 1)

    def select(self, rows: torch.Tensor) -> Transitions:
        """These transition rows only (the states stay: the learner forwards only the
        states its rows start from)."""

        def pick(t):
            return None if t is None else t[rows]

        return replace(
            self,
            next_samples=self.next_samples[rows],
            next_step=self.next_step[rows],
            old_log_probs=self.old_log_probs[rows],
            state_index=self.state_index[rows],
            adv_slot=self.adv_slot[rows],
            old_means=pick(self.old_means),
            noise_scale=pick(self.noise_scale),
        )

    def step_std(self, rows: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """The std each of ``rows`` was drawn with: the SDE's ``std`` times the step's
        noise scale (the same on the rollout and in the learner's recompute)."""
        if self.noise_scale is None:
            return std
        return std * self.noise_scale[rows].to(std.device, std.dtype)

    def __len__(self) -> int:
        return int(self.old_log_probs.shape[0])

    def to(self, device) -> Transitions:
        """The sample tensors on ``device``; the index tensors stay on the CPU, where
        the bookkeeping that reads them runs (a CUDA tensor takes CPU indices)."""
        return replace(
            self,
            states=self.states.to(device),
            next_samples=self.next_samples.to(device),
            old_log_probs=self.old_log_probs.to(device),
            old_means=None if self.old_means is None else self.old_means.to(device),
        )


@dataclass
class Trajectories(SharedWhenPickled):
    worker: int
    iteration: int
    version: int
    prompts: list[str]
    plan: RolloutPlan
    transitions: Transitions
    cond: dict[str, torch.Tensor]
    leaf_rewards: dict[str, torch.Tensor]
    nfe: int  # every sample evaluation of the rollout
    model_calls: int
    nfe_algorithm: int = 0  # of which the algorithm needs (not a baseline's logging anchors)
    leaf_latents: torch.Tensor | None = None  # [leaves, ...] clean latents (plan.keep_leaves)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors it carries (what moves from a worker to each learner)."""
        tensors = [*vars(self.transitions).values(), *self.cond.values(), self.leaf_latents]
        tensors += list(self.leaf_rewards.values())
        return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))

    def summary(self) -> RolloutSummary:
        """What the driver reads of it: everything but the samples."""
        return RolloutSummary(
            worker=self.worker,
            iteration=self.iteration,
            version=self.version,
            plan=self.plan,
            leaf_rewards=self.leaf_rewards,
            nfe=self.nfe,
            model_calls=self.model_calls,
            nfe_algorithm=self.nfe_algorithm,
            timings=dict(self.timings),
            nbytes=self.nbytes,
        )


@dataclass
class RolloutSummary:
    """A worker's rollout as the driver sees it (its rewards, counts, timings and
    size) while the trajectories themselves go from the worker's node straight to the
    learner ranks by object reference, never through the driver."""

    worker: int
    iteration: int
    version: int
    plan: RolloutPlan
    leaf_rewards: dict[str, torch.Tensor]
    nfe: int
    model_calls: int
    nfe_algorithm: int
    timings: dict[str, float]
    nbytes: int


def adv_slot_offsets(batches: list[Trajectories]) -> list[int]:
    """Where each batch's advantage slots start once the batches are merged (their
    plans' advantage tensors laid end to end, in batch order)."""
    offsets, total = [], 0
    for b in batches:
        offsets.append(total)
        total += math.prod(b.plan.adv_shape)
    return offsets
