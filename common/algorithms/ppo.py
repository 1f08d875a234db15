"""PPO-clip surrogate on the per-step log-probs (the GRPO loss, Eq. 7).

r = exp(log π_θ − log π_old),  L = mean( max(−A·r, −A·clip(r, 1−ε, 1+ε)) ),
optionally with a positive weight per transition (TempFlow-GRPO's noise-aware w_k).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PPOStats:
    loss: torch.Tensor
    ratio: torch.Tensor  # detached, per transition
    clipped: torch.Tensor  # bool, per transition: |r − 1| > ε (the clip is active)


def ppo_clip_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float,
    weights: torch.Tensor | None = None,
) -> PPOStats:
    """Mean PPO-clip loss over the given transitions (gradient flows through log_prob).
    ``weights`` (> 0, per transition) scale both PPO terms, TempFlow-GRPO's
    mean(max(−w·A·r, −w·A·clip(r))) = mean(w·max(−A·r, −A·clip(r)))."""
    return clipped_surrogate(
        log_prob - old_log_prob.to(log_prob.dtype), advantages, clip_range, weights
    )


def clipped_surrogate(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float,
    weights: torch.Tensor | None = None,
) -> PPOStats:
    """The PPO-clip surrogate of r = exp(log_ratio), whatever ratio that is (the plain
    one above, GRPO-Guard's normalised one below)."""
    if clip_range <= 0:
        raise ValueError(f"clip_range must be > 0, got {clip_range}")
    adv = advantages.to(log_ratio.dtype)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    per_transition = torch.maximum(unclipped, clipped)
    if weights is not None:
        per_transition = per_transition * weights.to(per_transition)
    loss = per_transition.mean()
    outside = (ratio - 1.0).abs().detach() > clip_range
    return PPOStats(loss=loss, ratio=ratio.detach(), clipped=outside)


def guard_log_ratio(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    mean: torch.Tensor,
    old_mean: torch.Tensor,
    std: torch.Tensor,
) -> torch.Tensor:
    """GRPO-Guard's RatioNorm (arXiv 2510.22319; flow_grpo train_sd3_GRPO_Guard.py):
    log r̂ = τ·(log π_θ − log π_old + b), b = mean((μ_θ − μ_old)²)/(2τ²), b not detached.
    Under the rollout's own noise x' = μ_old + τε this is mean(ε ⊙ (μ_θ − μ_old)):
    centred on 0, its spread O(|δ|) instead of O(|δ|/τ). τ per transition ([m]), not
    the batch mean the official code takes (it assumes one step per micro-batch)."""
    tau = std.to(log_prob.device, log_prob.dtype).reshape(-1)
    delta = mean - old_mean.to(mean)
    bias = (delta**2).flatten(1).mean(dim=1) / (2.0 * tau**2)
    return tau * (log_prob - old_log_prob.to(log_prob) + bias)


def kl_to_reference(
    mean: torch.Tensor, reference_mean: torch.Tensor, diffusion_coef: torch.Tensor
) -> torch.Tensor:
    """Flow-GRPO's KL penalty per sample: mean((μ_θ − μ_ref)²) / (2g²).

    Note the denominator is g², not g²·|Δ| as in the exact Gaussian KL (the
    reference code's choice, kept so β values transfer).
    """
    g2 = (diffusion_coef.to(mean.dtype) ** 2).reshape(-1)
    return ((mean - reference_mean) ** 2).flatten(1).mean(dim=1) / (2.0 * g2)
