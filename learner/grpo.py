"""The GRPO update on stored SDE transitions (pure torch, no Ray).

For each trained step t the policy's velocity is recomputed at the stored states
(one forward per distinct state: in G²RPO one per (prompt, k), shared by the G
members), the step's Gaussian log-prob of each stored x_{t+1} is re-evaluated,
and the PPO-clip loss is minimised. Optimizer steps:

* ``per_sde_step``: after each SDE step's transitions, loss = their mean (the
  official G²RPO HPS script: K steps per iteration);
* ``accumulate``: once per iteration, every transition weighted equally (G²RPO's
  other published version, Σ_k mean_k / K; Flow-GRPO-style accumulation);
* ``per_samples``: after every ``samples_per_step`` samples, every (sample, step)
  weighted equally (DanceGRPO/MixGRPO's gradient accumulation over samples).

Within an optimizer step the states of every SDE step it holds go through the model
together, in as few forwards as ``max_batch`` allows (``replay.py``: the one-gather
replay; exact under ``accumulate``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from ..common.algorithms.ppo import clipped_surrogate, guard_log_ratio, kl_to_reference
from ..common.algorithms.schedules import SamplingGrid
from ..common.algorithms.sde import (
    SDEType,
    diffusion_coefficient,
    gaussian_log_prob,
    step_coefficients,
    transition_mean,
)
from ..common.families.transformer_call import naming_backend
from ..common.wire.trajectories import Transitions
from ..rollout_worker.engine import VelocityModel
from .distributed import SINGLE, RankShare, gather_objects, sum_gradients, total_norm
from .replay import Replay, StepMode, optimizer_groups, replay_chunks


@dataclass(frozen=True)
class StepSpec:
    """What the learner must know of the sampler to recompute a step's density."""

    grid: SamplingGrid
    eta: float
    sde_type: SDEType
    # PPO weight of a transition by the grid step it leaves ([T] float64; TempFlow-GRPO)
    step_weights: torch.Tensor | None = None
    # GRPO-Guard: the normalised ratio r̂, each transition's loss over its |Δσ|
    ratio_norm: bool = False
    # CPS with flow_grpo's log-prob (no variance): log r̃ = 2τ²·log r
    cps_flow_grpo: bool = False


@dataclass
class UpdateStats:
    loss: float
    ratio_mean: float
    ratio_min: float
    ratio_max: float
    clip_fraction: float
    grad_norm: float  # mean pre-clip norm over optimizer steps
    grad_norm_max: float
    optimizer_steps: int
    kl: float
    transitions: int
    nfe_learn: int  # sample forwards of the recompute (and of the KL reference)
    nfe_learn_no_grad: int  # those of them without a backward (the KL reference's)
    # the policy's forward calls on one rank (padding passes included; the most of any
    # rank): under FSDP2 each gathers every block, and its backward each block again
    learner_calls: int

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


def recompute_log_probs(
    model: VelocityModel,
    transitions: Transitions,
    rows: torch.Tensor,
    cond: Mapping[str, torch.Tensor],
    spec: StepSpec,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """log π_θ(x_{t'} | x_t) of the given transition rows, one forward per distinct state.

    Returns (log_prob [m], mean [m, ...], diffusion coefficient g [m]).
    """
    state_of_row = transitions.state_index[rows]
    unique_states, inverse = torch.unique(state_of_row, return_inverse=True)
    # the model's device is the conditioning's (the learner puts it there); the states
    # may be on the host and move one chunk at a time
    device = next(iter(cond.values())).device
    x = transitions.states[unique_states].to(device)
    steps = transitions.state_step[unique_states]
    sigmas = spec.grid.sigmas
    timestep = spec.grid.timesteps[steps]
    prompts = transitions.state_prompt[unique_states].to(device)
    v = model(x, timestep.to(device), {k: c.index_select(0, prompts) for k, c in cond.items()})
    inverse = inverse.to(device)
    sigma = sigmas[transitions.state_step[state_of_row]]
    sigma_next = sigmas[transitions.next_step[rows]]
    coefs = step_coefficients(sigma, sigma_next, spec.eta, spec.sde_type, spec.grid.sigma_1)
    mean = transition_mean(x[inverse].to(torch.float32), v[inverse].to(torch.float32), coefs)
    std = transitions.step_std(rows, coefs.std)
    log_prob = gaussian_log_prob(transitions.next_samples[rows].to(device), mean, std)
    if spec.sde_type == "cps":  # its KL divides by 2τ² (flow_grpo's exact KL for CPS)
        g = std
    else:
        g = diffusion_coefficient(sigma, spec.eta, spec.sde_type, spec.grid.sigma_1)
    return log_prob, mean, g


def grpo_update(
    model: VelocityModel,
    parameters: Sequence[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    transitions: Transitions,
    advantages: torch.Tensor,
    cond: Mapping[str, torch.Tensor],
    spec: StepSpec,
    *,
    clip_range: float,
    max_grad_norm: float,
    step_mode: StepMode = "per_sde_step",
    samples_per_step: int = 1,
    max_batch: int = 64,
    reference_model: VelocityModel | None = None,
    kl_beta: float = 0.0,
    share: RankShare = SINGLE,
    replay: Replay = "stacked",
) -> UpdateStats:
    """One iteration's policy update. ``advantages`` is the plan's flat advantage
    tensor; transition i uses advantages[transitions.adv_slot[i]]. In a learner
    group every rank calls this on the whole iteration and ``share`` picks the
    states it recomputes; the returned stats are the group's. ``replay``: how a
    step's states are batched into forwards (``replay.replay_chunks``)."""
    if len(transitions) == 0:
        raise ValueError("no trained transitions in this rollout")
    if samples_per_step < 1:
        raise ValueError(f"samples_per_step must be >= 1, got {samples_per_step}")
    if kl_beta > 0 and reference_model is None:
        raise ValueError("kl_beta > 0 needs a reference_model")
    params = list(parameters)
    adv = advantages.reshape(-1)[transitions.adv_slot]
    groups = optimizer_groups(transitions, step_mode, samples_per_step)
    ref = reference_model if kl_beta > 0 else None
    chunk_loss = partial(_chunk_loss, model, transitions, cond, spec, adv, clip_range, ref, kl_beta)

    ratios, clipped, norms = [], [], []
    total_loss = total_kl = 0.0
    nfe = nfe_no_grad = calls = 0
    optimizer.zero_grad(set_to_none=True)
    for group in groups:
        # Chunk by distinct states so memory stays bounded; losses are weighted by
        # their share of the whole group, so the gradient (summed over chunks and
        # ranks) equals the group mean.
        for chunk in replay_chunks(transitions, group, share, max_batch, replay):
            calls += 1
            if chunk is None:
                _padding_pass(model, ref, transitions, group[:1], cond, spec)
                continue
            frac = chunk.numel() / group.numel()
            forwards = int(torch.unique(transitions.state_index[chunk]).numel())
            ref_forwards = forwards if ref is not None else 0  # no backward
            nfe += forwards + ref_forwards
            nfe_no_grad += ref_forwards
            loss, stats, kl = chunk_loss(chunk)
            # the backward runs the attention kernels the forward chose: name them
            with naming_backend(getattr(model, "attention_backend", "auto")):
                (loss * frac).backward()
            total_loss += float(loss.detach()) * frac / len(groups)
            total_kl += kl * frac / len(groups)
            ratios.append(stats.ratio.float().cpu())
            clipped.append(stats.clipped.cpu())
        if share.world > 1 and not share.sharded:
            sum_gradients(params)  # data parallel; FSDP reduced them in the backward
        norms.append(total_norm(torch.nn.utils.clip_grad_norm_(params, max_grad_norm)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    ratio = torch.cat(ratios) if ratios else torch.ones(0)
    clip = torch.cat(clipped).float() if clipped else torch.zeros(0)
    if share.world > 1:  # the group's numbers: every rank's ratios, sums of the rest
        parts = gather_objects((ratio, clip, total_loss, total_kl, nfe, nfe_no_grad, calls))
        ratio = torch.cat([p[0] for p in parts])
        clip = torch.cat([p[1] for p in parts])
        total_loss, total_kl, nfe, nfe_no_grad = (sum(p[i] for p in parts) for i in (2, 3, 4, 5))
        calls = max(p[6] for p in parts)
    return UpdateStats(
        loss=total_loss,
        ratio_mean=float(ratio.mean()),
        ratio_min=float(ratio.min()),
        ratio_max=float(ratio.max()),
        clip_fraction=float(clip.mean()),
        grad_norm=sum(norms) / len(norms),
        grad_norm_max=max(norms),
        optimizer_steps=len(norms),
        kl=total_kl,
        transitions=len(transitions),
        nfe_learn=nfe,
        nfe_learn_no_grad=nfe_no_grad,
        learner_calls=calls,
    )


def _padding_pass(model, reference, transitions, rows, cond, spec) -> None:
    """What a sharded rank with no states left runs so FSDP's collectives stay in
    step with the others': the forwards of a real chunk (the policy's, the KL
    reference's) and a backward of zero. It stops at the transition mean (finite),
    before the log-prob and the ratio, so no overflow there can turn 0·x into NaN."""
    _, mean, _ = recompute_log_probs(model, transitions, rows, cond, spec)
    if reference is not None:
        with torch.no_grad():
            recompute_log_probs(reference, transitions, rows, cond, spec)
    (mean.sum() * 0.0).backward()


def policy_log_ratio(spec, transitions, rows, log_prob, mean):
    """The ratio the surrogate clips, as log r, and each transition's loss weight (None:
    all 1): PPO's log π_θ − log π_old; with ``spec.cps_flow_grpo`` that times 2τ² (flow_grpo's
    CPS log-prob drops the variance: r̃ = r^(2τ²)); with ``spec.ratio_norm`` GRPO-Guard's
    normalised ratio, each loss over its |Δσ|; TempFlow's step weights on top."""
    from_step = transitions.state_step[transitions.state_index[rows]]
    weights = None if spec.step_weights is None else spec.step_weights[from_step]
    old_log_prob = transitions.old_log_probs[rows].to(log_prob.device)
    if not (spec.ratio_norm or spec.cps_flow_grpo):
        return log_prob - old_log_prob.to(log_prob.dtype), weights
    sigmas = spec.grid.sigmas
    sigma, sigma_next = sigmas[from_step], sigmas[transitions.next_step[rows]]
    std = step_coefficients(sigma, sigma_next, spec.eta, spec.sde_type, spec.grid.sigma_1).std
    std = transitions.step_std(rows, std)
    if spec.cps_flow_grpo:
        scale = (2.0 * std**2).to(log_prob.device, log_prob.dtype)
        return (log_prob - old_log_prob.to(log_prob.dtype)) * scale, weights
    if transitions.old_means is None:
        raise ValueError(
            "optim.loss grpo_guard needs each step's rollout mean: the rollout did not "
            "keep them (a worker on another config?)"
        )
    old_mean = transitions.old_means[rows].to(mean.device)
    guard = 1.0 / (sigma - sigma_next)  # GRPO-Guard's per-step reweighting 1/|Δ|
    weights = guard if weights is None else weights * guard
    return guard_log_ratio(log_prob, old_log_prob, mean, old_mean, std), weights


def _chunk_loss(model, transitions, cond, spec, adv, clip_range, reference, kl_beta, rows):
    """PPO-clip loss of some transition rows (mean over them), plus β·KL to the
    reference: (loss, PPO stats, KL as a float)."""
    log_prob, mean, g = recompute_log_probs(model, transitions, rows, cond, spec)
    log_ratio, weights = policy_log_ratio(spec, transitions, rows, log_prob, mean)
    stats = clipped_surrogate(log_ratio, adv[rows].to(log_prob.device), clip_range, weights)
    if reference is None:
        return stats.loss, stats, 0.0
    with torch.no_grad():
        _, ref_mean, _ = recompute_log_probs(reference, transitions, rows, cond, spec)
    kl = kl_to_reference(mean, ref_mean, g.to(mean.device)).mean()
    return stats.loss + kl_beta * kl, stats, float(kl.detach())
