"""DiffusionNFT (arXiv 2509.16117; NVlabs/DiffusionNFT train_nft_sd3.py @24af555): online
RL on the forward process. No trajectory log-probs: the learner takes the rollout's clean
samples x0 and their rewards, noises x0 to x_t = (1−t)·x0 + t·ε at grid times t, and trains
the velocity v_θ against two implicit policies built with an "old" velocity v_old:

    v⁺ = β·v_θ + (1−β)·v_old,   v⁻ = (1+β)·v_old − β·v_θ,   x̂0^± = x_t − t·v^±
    L^± = mean((x̂0^± − x0)²) / sg(max(mean|x̂0^± − x0|, 1e-5))      (adaptive x0 loss)
    L   = c·mean[(r·L⁺ + (1−r)·L⁻) / β] + β_KL·mean((v_θ − v_ref)²)

with r = ½ + ½·clip(A/c, −1, 1) from the group advantage A and c = optim.adv_clip (the
code's adv_clip_max, 5). The old velocity is a copy of the trained weights, moved towards
them after each update: θ_old ← λ·θ_old + (1−λ)·θ, λ from the optimizer step count n.

AWM (Advantage Weighted Matching, arXiv 2509.25050) shares the seam: the same clean
samples and old copy (its EMA-KL adapter), a different per-pair term (``awm_loss``) at
stratified grid times. Pure torch; ``forward_process.ForwardProcess`` is the objective
the learner core calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import contextmanager

import torch

from ..common.algorithms.schedules import SamplingGrid
from ..common.algorithms.sde import x0_prediction
from .distributed import SINGLE, RankShare, gather_objects, sum_gradients, total_norm

OldDecay = str  # "linear_to_0_5" | "delayed_linear_to_0_999" | "linear_to_0_3" | "copy"


def nft_reward_weight(advantages: torch.Tensor, adv_clip: float) -> torch.Tensor:
    """r = ½ + ½·clip(A/c, −1, 1) ∈ [0, 1]: the weight of the positive policy's loss."""
    return (0.5 + 0.5 * (advantages.clamp(-adv_clip, adv_clip) / adv_clip)).clamp(0.0, 1.0)


def old_decay(step: int, kind: OldDecay) -> float:
    """λ of the old policy's soft update after ``step`` optimizer steps (the official
    decay_type 1: min(0.001·n, 0.5); 2: 0 before 75 steps, then min(0.0075·(n−75), 0.999);
    copy: λ = 0, the old policy is the current one after every update)."""
    if kind == "linear_to_0_5":
        return min(0.001 * step, 0.5)
    if kind == "delayed_linear_to_0_999":
        return 0.0 if step < 75 else min(0.0075 * (step - 75), 0.999)
    if kind == "linear_to_0_3":  # AWM's EMA-KL adapter: min(0.001·n, 0.3)
        return min(0.001 * step, 0.3)
    if kind == "copy":
        return 0.0
    raise ValueError(
        f"old_decay must be linear_to_0_5, delayed_linear_to_0_999, linear_to_0_3 or copy: {kind!r}"
    )


def adaptive_x0_loss(x0_hat: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """Per sample: mean((x̂0 − x0)²) / sg(max(mean|x̂0 − x0|, 1e-5))."""
    err = (x0_hat - x0).flatten(1)
    scale = err.abs().mean(dim=1).clamp_min(1e-5).detach()
    return (err**2).mean(dim=1) / scale


def nft_loss(
    v_theta: torch.Tensor,
    v_old: torch.Tensor,
    x_t: torch.Tensor,
    x0: torch.Tensor,
    t: torch.Tensor,
    r: torch.Tensor,
    beta: float,
    adv_clip: float,
) -> torch.Tensor:
    """Per (sample, t) policy loss c·(r·L⁺ + (1−r)·L⁻)/β; ``t`` and ``r`` are [B]."""
    v_pos = beta * v_theta + (1.0 - beta) * v_old
    v_neg = (1.0 + beta) * v_old - beta * v_theta
    loss_pos = adaptive_x0_loss(x0_prediction(x_t, v_pos, t), x0)
    loss_neg = adaptive_x0_loss(x0_prediction(x_t, v_neg, t), x0)
    r = r.to(loss_pos)
    return adv_clip * (r * loss_pos + (1.0 - r) * loss_neg) / beta


class OldPolicy:
    """The old velocity's weights: a copy of the trained parameters, swapped in for its
    forwards and moved towards the trained ones after each update."""

    def __init__(self, params: Sequence[torch.nn.Parameter]) -> None:
        self.params = list(params)
        self.weights = [p.detach().clone() for p in self.params]

    @contextmanager
    def swapped(self):
        """The parameters hold the old weights inside the block (no autograd there)."""
        with torch.no_grad():
            for p, w in zip(self.params, self.weights, strict=True):
                p.data, w.data = w.data, p.data
        try:
            yield
        finally:
            with torch.no_grad():
                for p, w in zip(self.params, self.weights, strict=True):
                    p.data, w.data = w.data, p.data

    @torch.no_grad()
    def soft_update(self, lam: float) -> None:
        for p, w in zip(self.params, self.weights, strict=True):
            w.mul_(lam).add_(p.detach(), alpha=1.0 - lam)

    @torch.no_grad()
    def to(self, device: torch.device) -> None:
        self.weights = [w.to(device) for w in self.weights]

    def state(self) -> list[torch.Tensor]:
        return [w.detach().cpu().clone() for w in self.weights]

    def load(self, state: list[torch.Tensor]) -> None:
        if len(state) != len(self.weights):
            raise ValueError(f"old policy: {len(state)} tensors for {len(self.weights)}")
        for w, s in zip(self.weights, state, strict=True):
            w.copy_(s.to(w))


def awm_loss(
    v_theta: torch.Tensor,
    x0: torch.Tensor,
    eps: torch.Tensor,
    t: torch.Tensor,
    adv: torch.Tensor,
    power: float = 0.25,
) -> torch.Tensor:
    """AWM's per (sample, t) policy term (scxue/advantage_weighted_matching
    train_sd3_awm.py, "ghuber"): L = mean((v_θ − (ε − x0))²), ℓ = −(t/p)·((L + 1e-10)^p −
    1e-10^p), term = −A·exp(ℓ − sg(ℓ)): value −A, gradient A·t·(L + 1e-10)^(p−1)·∇L, an
    advantage-weighted, robustly weighted flow-matching loss."""
    err = (v_theta - (eps - x0)).flatten(1)
    fm = (err**2).mean(dim=1)
    tiny = 1e-10
    ell = -(t.to(fm) / power) * ((fm + tiny) ** power - tiny**power)
    return -adv.to(fm) * torch.exp(ell - ell.detach())


def grid_permutation_steps(n: int, steps: int, per_sample: int, generator) -> torch.Tensor:
    """[n, per_sample] distinct grid indices of {0 … T−1} per sample (DiffusionNFT)."""
    return torch.stack([torch.randperm(steps, generator=generator)[:per_sample] for _ in range(n)])


def stratified_steps(n: int, low: int, high: int, strata: int, generator) -> torch.Tensor:
    """[n, strata]: one grid index per stratum of {low … high−1}, the later strata one
    longer when they do not divide evenly (AWM's discrete_wo_init on 14 steps: {1},
    {2,3}, …, {10,11} from low 1, high 12)."""
    count = high - low
    if count < strata:
        raise ValueError(f"{strata} strata need {strata} grid steps, got {count}")
    base, extra = divmod(count, strata)
    sizes = [base] * (strata - extra) + [base + 1] * extra
    starts = torch.tensor([low + sum(sizes[:i]) for i in range(strata)])
    offsets = torch.rand((n, strata), generator=generator) * torch.tensor(sizes)
    return starts + offsets.long()


def forward_process_update(
    model,
    parameters: Sequence[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    old: OldPolicy,
    latents: torch.Tensor,
    prompts: torch.Tensor,
    cond: Mapping[str, torch.Tensor],
    grid: SamplingGrid,
    pair_steps: torch.Tensor,
    generator: torch.Generator,
    per_pair_loss,
    *,
    max_grad_norm: float,
    max_batch: int,
    reference=None,
    kl_beta: float = 0.0,
    old_kl: float = 0.0,
    share: RankShare = SINGLE,
) -> dict[str, float]:
    """One optimizer step on every (sample, t) pair of an iteration, the forward-process
    family's shared loop: ``latents`` [N, ...] the clean samples, ``prompts`` [N] their
    conditioning rows, ``pair_steps`` [N, K] the grid indices each is noised at (a fresh
    ε per pair from ``generator``); ``per_pair_loss(v_θ, v_old, x_t, x0, ε, t, sample
    rows)`` gives the method's term, plus kl_beta·mean((v_θ − v_ref)²) and
    old_kl·mean((v_θ − v_old)²). In a (data-parallel) learner group every rank draws
    the whole iteration's ε, takes ``share``'s contiguous part of the pairs, weights
    each chunk by its share of all of them and the ranks' gradients are summed: the
    step one learner takes, up to the order of additions."""
    if share.sharded:
        raise ValueError("the forward-process update runs on unsharded learners")
    params = list(parameters)
    device = next(iter(cond.values())).device
    n, per_sample = pair_steps.shape
    sample_of = torch.arange(n).repeat_interleave(per_sample)
    step_of = pair_steps.reshape(-1)
    noise = torch.randn((sample_of.numel(), *latents.shape[1:]), generator=generator)
    pairs = sample_of.numel()
    optimizer.zero_grad(set_to_none=True)
    total_loss = total_kl = 0.0
    forwards = no_grad = 0  # every sample forward; those without a backward
    every = torch.arange(pairs)
    for rows in share.chunks(every, every, max_batch):  # each pair its own "state"
        s_rows, k_rows = sample_of[rows], step_of[rows]
        x0 = latents[s_rows].to(device, torch.float32)
        eps = noise[rows].to(device)
        t = grid.sigmas[k_rows].to(device, torch.float32)
        tt = t.view(-1, *([1] * (x0.ndim - 1)))
        x_t = (1.0 - tt) * x0 + tt * eps
        timestep = grid.timesteps[k_rows].to(device)
        c = {k: v.index_select(0, prompts[s_rows].to(device)) for k, v in cond.items()}
        with torch.no_grad(), old.swapped():
            v_old = model(x_t, timestep, c)
        v_theta = model(x_t, timestep, c)
        forwards += 2 * len(rows)
        no_grad += len(rows)  # the old velocity's
        loss = per_pair_loss(v_theta, v_old, x_t, x0, eps, t, s_rows).mean()
        if old_kl > 0:
            loss = loss + old_kl * ((v_theta - v_old) ** 2).flatten(1).mean(dim=1).mean()
        if reference is not None and kl_beta > 0:
            with torch.no_grad():
                v_ref = reference(x_t, timestep, c)
            kl = ((v_theta - v_ref) ** 2).flatten(1).mean(dim=1).mean()
            loss = loss + kl_beta * kl
            total_kl += float(kl.detach()) * len(rows) / pairs
            forwards += len(rows)
            no_grad += len(rows)
        (loss * (len(rows) / pairs)).backward()
        total_loss += float(loss.detach()) * len(rows) / pairs
    if share.world > 1:  # the group's gradient and numbers: sums over the ranks
        sum_gradients(params)
        parts = gather_objects((total_loss, total_kl, forwards, no_grad))
        total_loss, total_kl, forwards, no_grad = (sum(p[i] for p in parts) for i in range(4))
    norm = total_norm(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {
        "loss": total_loss,
        "ratio_mean": 1.0,  # no likelihood ratio: the forward process has none
        "ratio_min": 1.0,
        "ratio_max": 1.0,
        "clip_fraction": 0.0,
        "grad_norm": norm,
        "grad_norm_max": norm,
        "optimizer_steps": 1,
        "kl": total_kl,
        "transitions": n,
        "nfe_learn": forwards,
        "nfe_learn_no_grad": no_grad,
        "forward_pairs": pairs,
    }
