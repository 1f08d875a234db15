"""Which steps a method branches or trains at in a given iteration, where that moves
from one iteration to the next: MixGRPO's progressive window, and G²RPO's cheaper
schedules (algorithm.g2rpo: a few of sampling.sde_steps, drawn or sliding)."""

from __future__ import annotations

import torch

from ..common.algorithms.seeds import seed_for

# seed_for's stream of G²RPO's per-iteration step draw (worker 0's: one draw for all)
STEP_DRAW_STREAM = 3


def g2rpo_branch_steps(
    sde_steps: list[int],
    iteration: int,
    seed: int,
    per_iteration: int | None,
    choice: str = "sampled",
    slide_every: int = 25,
) -> list[int]:
    """The SDE steps G²RPO branches at in ``iteration`` (algorithm.g2rpo): all of
    ``sde_steps``, or ``per_iteration`` of them, either drawn uniformly without
    replacement from (run seed, iteration) alone (every worker and a redone rollout
    draw the same) or a window of consecutive entries that moves one entry later every
    ``slide_every`` iterations and starts over once it has reached the last."""
    n = len(sde_steps)
    if per_iteration is None or per_iteration >= n:
        return list(sde_steps)
    if choice == "sliding":
        start = (iteration // slide_every) % (n - per_iteration + 1)
        return list(sde_steps[start : start + per_iteration])
    gen = torch.Generator().manual_seed(seed_for(seed, iteration, 0, STEP_DRAW_STREAM))
    picked = torch.randperm(n, generator=gen)[:per_iteration].sort().values
    return [sde_steps[i] for i in picked.tolist()]


def mixgrpo_window(
    iteration: int, num_steps: int, window_size: int, shift_every: int, stride: int, roll_back: bool
) -> tuple[int, int]:
    """MixGRPO's progressive window [start, end) as its GRPOTrainingStates moves it:
    steps range(s, min(s+W, T−2)), so the last stochastic step is T−3; s advances by
    ``stride`` every ``shift_every`` iterations and, once past T−3, restarts at 0
    (``roll_back``) or stays at T−3."""
    last = num_steps - 3
    if last < 0:
        raise ValueError(f"MixGRPO needs num_steps >= 3, got {num_steps}")
    moves = iteration // shift_every
    if stride == 0:
        start = 0
    elif roll_back:
        start = (moves % (last // stride + 1)) * stride
    else:
        start = min(moves * stride, last)
    return start, min(start + window_size, last + 1)
