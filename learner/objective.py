"""The seam between the learner core and an objective family: what the core hands an
objective for one update, and what it asks of one. The core (``trainer.LearnerCore``)
holds the model, optimizer and group share and advances the version; the family
(``policy_gradient.PolicyGradient``: the log-prob PPO methods; ``forward_process.
ForwardProcess``: DiffusionNFT and AWM) owns its loss and any state of its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..common.config.run import G2RPOConfig
from ..common.wire.trajectories import Trajectories
from .distributed import RankShare
from .grpo import StepSpec


@dataclass(frozen=True)
class LearnerParts:
    """The core's state an update reads and steps (the optimizer in place).
    ``iteration``: the iteration being learned (seeds and schedules key on it)."""

    cfg: G2RPOConfig
    velocity: Any  # common.families.flux.FluxVelocity over the trained transformer
    trainable: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    spec: StepSpec
    reference: Any  # the KL reference velocity, or None
    kl_beta: float
    share: RankShare
    iteration: int


class Objective(Protocol):
    def update(
        self, parts: LearnerParts, batches: list[Trajectories], advantages: torch.Tensor, lag: int
    ) -> dict:
        """One iteration's update from the workers' batches and their advantages (one
        per leaf, the batches' plan order concatenated); the row's learning stats."""

    def state(self) -> dict:
        """What a one-file checkpoint keeps of the objective besides the weights and
        optimizer ({} when nothing)."""

    def load(self, state: dict) -> None:
        """Back from a checkpoint's ``state()`` keys."""

    def to(self, device: torch.device) -> None:
        """Whatever the objective keeps on the device, to ``device`` (colocated
        time-sharing: the host while the rollout has the GPU)."""
