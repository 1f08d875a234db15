"""The forward-process family's update (DiffusionNFT, AWM): the rollout's clean samples
noised again at grid times and trained against an old copy of the weights (``nft.py``
holds the losses and the shared loop), then the old copy's soft update. Its state is
that copy and the optimizer steps its decay counts."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..common.algorithms.seeds import seed_for
from ..common.wire.trajectories import Trajectories
from .batches import merge
from .nft import (
    OldPolicy,
    awm_loss,
    forward_process_update,
    grid_permutation_steps,
    nft_loss,
    nft_reward_weight,
    old_decay,
    stratified_steps,
)
from .objective import LearnerParts


def clean_samples(batches: list[Trajectories], method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The batches' clean latents in plan order (the advantages' [P, G] order) and the
    merged conditioning row of each."""
    latents, prompts, offset = [], [], 0
    for b in batches:
        if b.leaf_latents is None:
            raise ValueError(f"algorithm.name {method} needs the rollout's clean latents")
        idx = b.plan.leaf_indices("sample")
        latents.append(b.leaf_latents[idx])
        prompts.append(torch.tensor([b.plan.leaves[i].prompt + offset for i in idx]))
        offset += b.plan.num_prompts
    return torch.cat(latents), torch.cat(prompts)


class ForwardProcess:
    """DiffusionNFT's old velocity or AWM's EMA-KL one over ``trainable``: a copy of
    the trained weights, moved towards them after each update."""

    def __init__(self, trainable: Sequence[torch.nn.Parameter]) -> None:
        self.old = OldPolicy(trainable)
        self.optimizer_steps = 0

    def update(
        self, parts: LearnerParts, batches: list[Trajectories], advantages: torch.Tensor, lag: int
    ) -> dict:
        cfg, adv = parts.cfg, advantages
        x0s, rows_prompt = clean_samples(batches, cfg.algorithm.name)
        _, cond = merge(batches)
        device = torch.device(cfg.model.device)
        cond = {k: v.to(device) for k, v in cond.items()}
        o, nft = cfg.optim, cfg.algorithm.nft
        gen = torch.Generator().manual_seed(seed_for(cfg.run.seed, parts.iteration, 0, 2))
        n, steps = x0s.shape[0], cfg.sampling.num_steps
        if cfg.algorithm.name == "awm":
            awm = cfg.algorithm.awm
            low = 1 if awm.strata_from == "after_noise" else 0
            pair_steps = stratified_steps(n, low, steps - 2, awm.timesteps, gen)
            weight = adv.clamp(-o.adv_clip, o.adv_clip) / o.adv_clip  # A in [-1, 1]

            def term(v_theta, v_old, x_t, x0, eps, t, s_rows):
                return awm_loss(v_theta, x0, eps, t, weight[s_rows].to(v_theta.device), awm.power)

            old_kl, decay = awm.ema_kl, awm.ema_decay
        else:
            pair_steps = grid_permutation_steps(n, steps, nft.timesteps or steps - 1, gen)
            r = nft_reward_weight(adv.double(), o.adv_clip).float()

            def term(v_theta, v_old, x_t, x0, eps, t, s_rows):
                return nft_loss(
                    v_theta, v_old, x_t, x0, t, r[s_rows].to(v_theta.device), nft.beta, o.adv_clip
                )

            old_kl, decay = 0.0, nft.old_decay
        stats = forward_process_update(
            parts.velocity,
            parts.trainable,
            parts.optimizer,
            self.old,
            x0s,
            rows_prompt,
            cond,
            parts.spec.grid,
            pair_steps,
            gen,
            term,
            max_grad_norm=o.max_grad_norm,
            max_batch=cfg.train.learner.max_batch,
            reference=parts.reference,
            kl_beta=parts.kl_beta,
            old_kl=old_kl,
            share=parts.share,
        )
        self.optimizer_steps += stats["optimizer_steps"]
        self.old.soft_update(old_decay(self.optimizer_steps, decay))
        stats.update({"weight_lag": lag, "adv_abs_mean": float(adv.abs().mean())})
        return stats

    def state(self) -> dict:
        return {"nft_old": self.old.state(), "optimizer_steps": self.optimizer_steps}

    def load(self, state: dict) -> None:
        self.old.load(state["nft_old"])
        self.optimizer_steps = state["optimizer_steps"]

    def to(self, device: torch.device) -> None:
        self.old.to(device)
