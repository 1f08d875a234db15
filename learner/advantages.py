"""From per-leaf rewards to the flat advantage tensor a plan's transitions index."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..common.advantages import (
    fuse_g2rpo_advantages,
    fuse_terminal_advantages,
    shuffle_within_groups,
)
from ..common.config import G2RPOConfig
from ..rollout_worker.plan import RolloutPlan


def plan_advantages(
    plan: RolloutPlan,
    leaf_rewards: Mapping[str, torch.Tensor],
    cfg: G2RPOConfig,
    control_generator: torch.Generator | None = None,
) -> torch.Tensor:
    """leaf_rewards[name]: [num_leaves] scores in plan order (anchor leaves ignored).

    Returns the plan's advantages flattened in slot order (float64). With
    ``cfg.algorithm.control`` the advantages are shuffled inside each group.
    """
    weights = cfg.reward_weights()
    unknown = set(leaf_rewards) - set(weights)
    if unknown:
        raise ValueError(f"rewards {sorted(unknown)} are not in the config's rewards list")
    opt = cfg.optim
    if plan.algorithm == "g2rpo":
        grids = {n: plan.gather(r, "branch") for n, r in leaf_rewards.items()}
        adv = fuse_g2rpo_advantages(
            grids, weights, adv_clip=opt.adv_clip, eps=opt.adv_eps, spread_tol=opt.adv_spread_tol
        )
    else:
        grids = {n: plan.gather(r, "sample") for n, r in leaf_rewards.items()}
        flow = plan.algorithm == "flowgrpo"
        adv = fuse_terminal_advantages(
            grids,
            weights,
            adv_clip=opt.adv_clip,
            # Flow-GRPO: population std + 1e-4; DanceGRPO/MixGRPO: unbiased + 1e-8.
            unbiased=not flow,
            eps=1e-4 if flow else opt.adv_eps,
            spread_tol=opt.adv_spread_tol,
            global_std=flow and cfg.algorithm.flowgrpo.adv_std == "global",
        )
    if tuple(adv.shape) != plan.adv_shape:
        raise AssertionError(f"advantages {tuple(adv.shape)} != plan {plan.adv_shape}")
    if cfg.algorithm.control:
        if control_generator is None:
            raise ValueError("the control run needs a generator for the shuffle")
        adv = shuffle_within_groups(adv, control_generator)
    return adv.reshape(-1)
