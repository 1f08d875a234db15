"""Sigma grids, model timesteps and the granular completion schedules of G²RPO.

All functions are pure; sigma grids are float64 so that every consumer (rollout,
learner, reference loop) derives bit-identical per-step coefficients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Terminal = Literal["exact", "reference"]
SigmaGrid = Literal["uniform", "diffusers"]


def time_shift(sigma: torch.Tensor, shift: float) -> torch.Tensor:
    """SD3/FLUX static time shift: s·σ / (1 + (s−1)·σ).

    Equal to FLUX's exponential shift with μ = ln s; fixes 0 and 1 for every s.
    """
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    return shift * sigma / (1.0 + (shift - 1.0) * sigma)


def sigma_schedule(num_steps: int, shift: float = 3.0) -> torch.Tensor:
    """The T+1 sigmas from 1 to 0: shift_s(linspace(1, 0, T+1)) in float64."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    unshifted = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    sigmas = time_shift(unshifted, shift)
    sigmas[0], sigmas[-1] = 1.0, 0.0  # exact endpoints whatever the rounding
    return sigmas


def model_timestep(sigma: torch.Tensor, quantize: bool = True) -> torch.Tensor:
    """Timestep fed to the transformer: floor(1000·σ)/1000 in float32, as the official
    code computes it on its float32 grid. The SDE/ODE math keeps the exact σ."""
    sigma = torch.as_tensor(sigma).to(torch.float32)
    if not quantize:
        return sigma
    return torch.floor(sigma * 1000.0) / 1000.0


@dataclass(frozen=True)
class SamplingGrid:
    """The σ grid (float64, for the step math) and the network's timesteps (float32)."""

    sigmas: torch.Tensor
    timesteps: torch.Tensor

    @property
    def num_steps(self) -> int:
        return int(self.sigmas.shape[0]) - 1

    @property
    def sigma_1(self) -> float:
        """Second grid value: the Flow-GRPO std's guard at σ=1 uses 1−σ₁."""
        return float(self.sigmas[1])


def diffusers_sigmas(num_steps: int, shift: float = 3.0) -> torch.Tensor:
    """The T+1 sigmas of diffusers' FlowMatchEulerDiscreteScheduler(shift) after
    ``set_timesteps(T)``, as StableDiffusion3Pipeline samples (and Flow-GRPO's SD3 code
    with it): linspace from 1 to its σ_min, shifted, then 0. Its σ_min is already a
    shifted 1/1000, which the second shift moves again (T=10, shift 3: last σ 0.0089,
    not 0.1 as shift₃(linspace(1, 0, 11))'s)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(num_steps)
    return scheduler.sigmas.to(torch.float64)


def sampling_grid(
    num_steps: int, shift: float = 3.0, quantize: bool = True, kind: SigmaGrid = "uniform"
) -> SamplingGrid:
    """σ in float64 and the timesteps the official code feeds: the same shifted grid
    built in float32, floored to 1/1000 (the two differ at ties such as T=12, σ=0.6).
    ``kind`` diffusers: the SD3 scheduler's own σ (``diffusers_sigmas``), its timesteps
    those σ in float32 (floored when ``quantize``)."""
    if kind == "diffusers":
        sigmas = diffusers_sigmas(num_steps, shift)
        return SamplingGrid(sigmas=sigmas, timesteps=model_timestep(sigmas.float(), quantize))
    sigmas = sigma_schedule(num_steps, shift)
    grid32 = time_shift(torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float32), shift)
    timesteps = model_timestep(grid32, quantize) if quantize else sigmas.to(torch.float32)
    return SamplingGrid(sigmas=sigmas, timesteps=timesteps)


def completion_indices(
    k: int, granularity: int, num_steps: int, terminal: Terminal = "exact"
) -> list[int]:
    """Grid indices a branch visits after the SDE step at k (starting at k+1).

    One full-resolution ODE step k+1 → k+2, then every g-th index (sigma[k+2::g]).
    When that coarse grid stops short of σ=0:
      * ``exact`` appends index T, so the branch always integrates down to σ=0;
      * ``reference`` replaces the last node by T: the official code returns the
        x0 prediction x − σ·v of its last *evaluated* node, which is exactly one
        Euler hop from that node to σ=0.
    """
    _check_branch(k, granularity, num_steps)
    nodes = [k + 1, *range(k + 2, num_steps + 1, granularity)]
    if nodes[-1] != num_steps:
        if terminal == "exact":
            nodes.append(num_steps)
        elif terminal == "reference":
            nodes[-1] = num_steps
        else:
            raise ValueError(f"terminal must be 'exact' or 'reference', got {terminal!r}")
    return nodes


def granular_schedule(
    k: int, granularity: int, num_steps: int, terminal: Terminal = "exact"
) -> list[int]:
    """Full index schedule of one branch: prefix 0..k+1 then the coarse completion."""
    return list(range(k + 1)) + completion_indices(k, granularity, num_steps, terminal)


def completion_step_count(k: int, granularity: int, num_steps: int, terminal: Terminal) -> int:
    """Closed form of len(completion_indices) − 1: ⌊(T−k−2)/g⌋ + 1 (+1 if exact and short)."""
    _check_branch(k, granularity, num_steps)
    rest = num_steps - k - 2
    steps = rest // granularity + 1
    if terminal == "exact" and rest % granularity != 0:
        steps += 1
    return steps


def _check_branch(k: int, granularity: int, num_steps: int) -> None:
    if not 0 <= k <= num_steps - 2:
        raise ValueError(
            f"SDE step k={k} must lie in [0, T-2={num_steps - 2}]: the last step ends at "
            "sigma=0, where the transition density degenerates"
        )
    if granularity < 1:
        raise ValueError(f"granularity must be >= 1, got {granularity}")


def expected_g2rpo_nfe(
    num_steps: int,
    group_size: int,
    sde_steps: list[int],
    granularities: list[int],
    terminal: Terminal = "exact",
    num_prompts: int = 1,
    share_granularity_prefix: bool = True,
) -> int:
    """Distinct model evaluations of one G²RPO rollout, counted from the schedules.

    Independent of the engine: enumerates each branch's evaluated nodes as
    (k, member, path prefix) tuples and counts the distinct ones. The anchor is
    evaluated at its T non-terminal nodes and also serves every SDE step.
    """
    distinct: set[tuple] = set()
    for k in sde_steps:
        for member in range(group_size):
            for g in granularities:
                nodes = completion_indices(k, g, num_steps, terminal)
                tag = None if share_granularity_prefix else g
                for depth in range(len(nodes) - 1):  # the σ=0 node is never evaluated
                    distinct.add((k, member, tag, tuple(nodes[: depth + 1])))
    return num_prompts * (num_steps + len(distinct))
