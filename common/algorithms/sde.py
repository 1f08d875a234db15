"""One reverse-time step of the flow ODE/SDE family shared by Flow-GRPO, DanceGRPO,
MixGRPO and G²RPO, with the Gaussian log-density of the step.

Rectified flow: x_σ = (1−σ)·x0 + σ·ε and the model predicts v ≈ ε − x0. With
Δ = σ_next − σ < 0 and diffusion coefficient g, the Euler–Maruyama step is

    μ = x·(1 + g²Δ/(2σ)) + v·(1 + g²(1−σ)/(2σ))·Δ,   x' = μ + g·√(−Δ)·ε,

(Flow-GRPO, Eq. 3 of the G²RPO paper). g = η·√(σ/(1−σ)) for the Flow-GRPO SDE
and g = η for DanceGRPO's. g = 0 gives the Euler ODE step x + Δ·v exactly.

Coefficients-Preserving Sampling (CPS, arXiv 2509.05952; flow_grpo's ``sde_type="cps"``)
is the DDIM-like step that keeps x' on the flow path σ' = σ_next:

    τ = σ'·sin(ηπ/2),   μ = (1−σ')·x̂0 + √(σ'² − τ²)·x̂1,   x' = μ + τ·ε,

with x̂0 = x − σv and x̂1 = x + (1−σ)v, so x' holds x0 with coefficient 1−σ' and noise
of variance σ'²; it is linear in (x, v) too: cx = 1−σ'+k, cv = k(1−σ) − σ(1−σ') with
k = σ'·cos(ηπ/2). η = 0 is the Euler step; σ' = 0 is deterministic. Its log-prob here
is the Gaussian one like every other step's; the official code drops the variance
(log r̃ = 2τ²·log r, which changes what a clip range means): ``optim.cps_ratio flow_grpo``.
Coefficients are computed in float64 from the exact σ and applied in float32 so
that rollout and learner reproduce each other bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

SDEType = Literal["flow", "dance", "cps"]
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass(frozen=True)
class StepCoefficients:
    """Per-sample coefficients of μ = cx·x + cv·v and the transition std (float64, [B])."""

    cx: torch.Tensor
    cv: torch.Tensor
    std: torch.Tensor


@dataclass(frozen=True)
class SDEStep:
    sample: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor  # [B] float64, std of the Gaussian step (g·√−Δ)
    log_prob: torch.Tensor | None  # [B]; None for a deterministic (η=0) step


def diffusion_coefficient(
    sigma: torch.Tensor, eta: torch.Tensor | float, sde_type: SDEType, sigma_1: float
) -> torch.Tensor:
    """g(σ). Flow-GRPO: η·√(σ/(1−σ)); at σ=1 the denominator uses 1−σ₁ (σ₁ = the
    grid's second value) exactly as the reference code does. DanceGRPO: g ≡ η."""
    sigma = torch.as_tensor(sigma, dtype=torch.float64)
    eta = torch.as_tensor(eta, dtype=torch.float64)
    if sde_type == "dance":
        return eta * torch.ones_like(sigma)
    if sde_type != "flow":
        raise ValueError(f"sde_type must be 'flow' or 'dance' for g(σ), got {sde_type!r}")
    guarded = torch.where(sigma >= 1.0, torch.full_like(sigma, sigma_1), sigma)
    return eta * torch.sqrt(sigma / (1.0 - guarded))


def step_coefficients(
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    eta: torch.Tensor | float,
    sde_type: SDEType = "flow",
    sigma_1: float = 0.0,
) -> StepCoefficients:
    """cx, cv and std of one step, per sample, in float64."""
    sigma = torch.as_tensor(sigma, dtype=torch.float64)
    sigma_next = torch.as_tensor(sigma_next, dtype=torch.float64)
    if torch.any(sigma <= 0):
        raise ValueError("a step must start at sigma > 0")
    if torch.any(sigma_next >= sigma):
        raise ValueError("sigma must decrease along a step")
    if sde_type == "cps":
        return cps_coefficients(sigma, sigma_next, eta)
    dt = sigma_next - sigma
    g = diffusion_coefficient(sigma, eta, sde_type, sigma_1)
    g2 = g * g
    cx = 1.0 + g2 / (2.0 * sigma) * dt
    cv = (1.0 + g2 * (1.0 - sigma) / (2.0 * sigma)) * dt
    return StepCoefficients(cx=cx, cv=cv, std=g * torch.sqrt(-dt))


def cps_coefficients(
    sigma: torch.Tensor, sigma_next: torch.Tensor, eta: torch.Tensor | float
) -> StepCoefficients:
    """CPS: τ = σ'·sin(ηπ/2) and μ = (1−σ')·x̂0 + σ'·cos(ηπ/2)·x̂1 written as cx·x + cv·v
    (√(σ'² − τ²) = σ'·cos(ηπ/2) exactly, so no square root of a rounded difference)."""
    eta = torch.as_tensor(eta, dtype=torch.float64)
    if torch.any(eta > 1):
        raise ValueError(f"CPS needs eta <= 1 (its noise is sigma'·sin(eta·pi/2)), got {eta}")
    angle = eta * (math.pi / 2.0)
    k = sigma_next * torch.cos(angle)
    cx = (1.0 - sigma_next) + k
    cv = k * (1.0 - sigma) - sigma * (1.0 - sigma_next)
    return StepCoefficients(cx=cx, cv=cv, std=sigma_next * torch.sin(angle))


def _per_sample(coef: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B] (or scalar) float64 → like.dtype, shaped [B, 1, …] to broadcast over a sample."""
    coef = coef.to(device=like.device, dtype=like.dtype)
    if coef.ndim == 0:
        return coef
    return coef.reshape(coef.shape[0], *([1] * (like.ndim - 1)))


def transition_mean(x: torch.Tensor, v: torch.Tensor, coefs: StepCoefficients) -> torch.Tensor:
    """μ = cx·x + cv·v (the SDE step's mean; the Euler step when g=0)."""
    return x * _per_sample(coefs.cx, x) + v * _per_sample(coefs.cv, x)


def gaussian_log_prob(sample: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """log N(sample; mean, std²·I), averaged (not summed) over all non-batch elements,
    as every reference implementation does. std is [B] (or scalar) and must be > 0."""
    std = torch.as_tensor(std, dtype=torch.float64)
    if torch.any(std <= 0):
        raise ValueError("log-prob of a deterministic step (std=0) is undefined")
    var2 = _per_sample(2.0 * std * std, sample)
    sq = -((sample.detach() - mean) ** 2) / var2
    const = (-torch.log(std) - _HALF_LOG_2PI).to(sample.device)
    # Reduce in float64 and round once: a float32 reduction's order depends on the
    # batch size, which would make rollout and learner log-probs differ in the last
    # bit and the PPO ratio miss exactly 1.
    return (sq.to(torch.float64).flatten(1).mean(dim=1) + const).to(sample.dtype)


def sde_step(
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: torch.Tensor | float,
    sigma_next: torch.Tensor | float,
    eta: torch.Tensor | float,
    *,
    sde_type: SDEType = "flow",
    sigma_1: float = 0.0,
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
) -> SDEStep:
    """One step from x (velocity v) at σ to σ_next.

    Either ``noise`` (ε, to draw the sample μ + std·ε) or ``prev_sample`` (a stored
    x', to re-evaluate its log-prob under the current v) is used; with η = 0 the
    step is deterministic and no log-prob is returned. Math runs in float32 or wider.
    """
    work = torch.promote_types(x.dtype, torch.float32)
    x, v = x.to(work), v.to(work)
    batch = x.shape[0]
    sigma = torch.as_tensor(sigma, dtype=torch.float64).expand(batch)
    sigma_next = torch.as_tensor(sigma_next, dtype=torch.float64).expand(batch)
    coefs = step_coefficients(sigma, sigma_next, eta, sde_type, sigma_1)
    mean = transition_mean(x, v, coefs)
    deterministic = bool(torch.all(coefs.std == 0))
    if prev_sample is not None:
        sample = prev_sample.to(work).detach()
    elif deterministic:
        sample = mean
    else:
        if noise is None:
            raise ValueError("a stochastic step needs `noise` or `prev_sample`")
        sample = mean + _per_sample(coefs.std, x) * noise.to(work)
    log_prob = None if deterministic else gaussian_log_prob(sample, mean, coefs.std)
    return SDEStep(sample=sample, mean=mean, std=coefs.std, log_prob=log_prob)


def ode_step(x: torch.Tensor, v: torch.Tensor, sigma, sigma_next) -> torch.Tensor:
    """Euler step of the probability-flow ODE, x + (σ_next − σ)·v (the η=0 SDE step)."""
    return sde_step(x, v, sigma, sigma_next, 0.0).sample


def x0_prediction(x: torch.Tensor, v: torch.Tensor, sigma) -> torch.Tensor:
    """Clean-image estimate x̂0 = x − σ·v."""
    sigma = torch.as_tensor(sigma, dtype=torch.float64)
    return x - _per_sample(sigma, x) * v


def noise_step_weights(
    sigmas: torch.Tensor, steps: list[int], eta: float, sde_type: SDEType, sigma_1: float
) -> torch.Tensor:
    """TempFlow-GRPO's noise-aware weights (arXiv 2508.04324, Eq. 8): step k's PPO terms
    scaled by τ_k / mean_{j∈steps} τ_j, τ the step's std. The official code hard-codes
    2.25·τ (SD3.5-M, T=10) and 1.73·τ (FLUX), which is this mean-1 normalisation for
    one grid; here it follows the grid. Returns [T] float64, 1 outside ``steps``."""
    sigmas = torch.as_tensor(sigmas, dtype=torch.float64)
    idx = torch.tensor(steps)
    std = step_coefficients(sigmas[idx], sigmas[idx + 1], eta, sde_type, sigma_1).std
    if torch.any(std <= 0):
        raise ValueError(f"noise-aware weights need noise at every trained step, got τ={std}")
    weights = torch.ones(len(sigmas) - 1, dtype=torch.float64)
    weights[idx] = std / std.mean()
    return weights
