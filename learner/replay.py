"""Which forwards the learner runs to replay an iteration's transitions: the rows of each
optimizer step (``optim.step_mode``) and, within a step, the micro-batches of distinct
states that one forward takes (``train.learner.max_batch``).

The one-gather replay (``stacked``, what training runs): an optimizer step's distinct
states, whatever SDE step each leaves from, stacked along the batch dimension, each row
with its own timestep and σ, in as few forwards as ``max_batch`` allows. Under
``accumulate`` (one optimizer step per iteration) it is exact: the step's loss is a
weighted mean over its transitions and each row's velocity depends only on its own state,
timestep and prompt, so stacking changes the floating-point rounding of a different batch
composition, not the loss or the gradient. Under ``per_sde_step`` an optimizer step's
states all leave one SDE step, so both replays run the same forwards on the same rows.

``per_step``: each SDE step's states in forwards of their own, under any step mode; the
replay the stacked one is checked against (tests/test_one_gather_replay.py) and timed
against (``g2rpo bench replay``).
"""

from __future__ import annotations

from typing import Literal

import torch

from ..common.wire.trajectories import Transitions
from .distributed import RankShare

StepMode = Literal["per_sde_step", "accumulate", "per_samples"]
Replay = Literal["stacked", "per_step"]


def optimizer_groups(
    transitions: Transitions, step_mode: StepMode, samples_per_step: int
) -> list[torch.Tensor]:
    """Transition rows of each optimizer step; the loss of a step is their mean."""
    rows = torch.arange(len(transitions))
    if step_mode == "accumulate":
        return [rows]
    if step_mode == "per_sde_step":
        step_of_row = transitions.state_step[transitions.state_index]
        return [rows[step_of_row == t] for t in torch.unique(step_of_row)]
    if step_mode == "per_samples":
        samples = torch.unique(transitions.adv_slot)
        return [
            rows[torch.isin(transitions.adv_slot, samples[lo : lo + samples_per_step])]
            for lo in range(0, samples.numel(), samples_per_step)
        ]
    raise ValueError(
        f"optim.step_mode must be 'per_sde_step', 'accumulate' or 'per_samples', got {step_mode!r}"
    )


def replay_chunks(
    transitions: Transitions,
    rows: torch.Tensor,
    share: RankShare,
    max_batch: int,
    replay: Replay = "stacked",
) -> list[torch.Tensor | None]:
    """This rank's forwards over one optimizer step's ``rows``: each the transition rows
    of at most ``max_batch`` distinct states (``None``: a sharded rank's padding pass).

    The stacked replay splits the step's states into ceil(states / max_batch) forwards,
    the fewest the cap allows. Each split costs a sharded learner (FSDP2) one more
    all-gather of every block and of the root in the forward, one more of every block in
    the backward, and one more reduce-scatter of every unit's gradients: 2·blocks + 1
    gathers and blocks + 1 reduce-scatters per extra forward (counted by ``g2rpo bench
    replay``), besides a launch of every kernel. ``max_batch`` bounds the activations one
    forward saves for its backward, which is why a step is split at all."""
    if replay == "stacked":
        return share.chunks(rows, transitions.state_index, max_batch)
    if replay == "per_step":
        from_step = transitions.state_step[transitions.state_index[rows]]
        return [
            chunk
            for t in torch.unique(from_step)
            for chunk in share.chunks(rows[from_step == t], transitions.state_index, max_batch)
        ]
    raise ValueError(f"replay must be 'stacked' or 'per_step', got {replay!r}")
