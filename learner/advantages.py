"""From per-leaf rewards to the flat advantage tensor a plan's transitions index."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..common.algorithms.advantages import (
    fuse_g2rpo_advantages,
    fuse_terminal_advantages,
    g2rpo_reward_terms,
    group_normalize,
    shuffle_within_groups,
    subtree_means,
    tree_depth_advantages,
)
from ..common.algorithms.rollout_plan import RolloutPlan
from ..common.config.algorithm import FORWARD_PROCESS
from ..common.config.run import G2RPOConfig


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
    elif plan.algorithm == "branchgrpo":
        adv = _branch_advantages(plan, leaf_rewards, weights, opt.adv_clip)
    elif plan.algorithm == "treegrpo":
        # the group is the tree's 2^depth leaves, normalised as Flow-GRPO does
        leaf_adv = _flowgrpo_normalised(
            _weighted_total(plan, leaf_rewards, weights, "sample"), opt, global_std=False
        )
        adv = _subtree_means(plan, leaf_adv)
    elif plan.algorithm == "tempflow":
        # per (prompt, branch step): the group is the G siblings of one anchor state
        total = _weighted_total(plan, leaf_rewards, weights, "branch")
        P, K, _, G = total.shape
        flat = _flowgrpo_normalised(total[:, :, 0].reshape(P * K, G), opt, global_std=False)
        adv = flat.reshape(P, K, G)
    elif plan.algorithm in FORWARD_PROCESS:
        # their per-prompt stat tracking with global_std; the learner maps A to r (NFT)
        # or to A/5 in [-1, 1] (AWM)
        adv = _flowgrpo_normalised(
            _weighted_total(plan, leaf_rewards, weights, "sample"), opt, global_std=True
        )
    elif plan.algorithm in ("flowgrpo", "flowgrpo_fast"):
        adv = _flowgrpo_normalised(
            _weighted_total(plan, leaf_rewards, weights, "sample"),
            opt,
            global_std=cfg.algorithm.flowgrpo.adv_std == "global",
        )
    else:
        if plan.algorithm == "mixgrpo":  # MixGRPO normalises the weights to sum to 1
            norm = sum(weights[n] for n in leaf_rewards)
            weights = {n: weights[n] / norm for n in leaf_rewards}
        grids = {n: plan.gather(r, "sample") for n, r in leaf_rewards.items()}
        adv = fuse_terminal_advantages(
            grids, weights, adv_clip=opt.adv_clip, eps=opt.adv_eps, spread_tol=opt.adv_spread_tol
        )
    if tuple(adv.shape) != plan.adv_shape:
        raise AssertionError(f"advantages {tuple(adv.shape)} != plan {plan.adv_shape}")
    if cfg.algorithm.control:
        if control_generator is None:
            raise ValueError("the control run needs a generator for the shuffle")
        adv = shuffle_within_groups(adv, control_generator)
    return adv.reshape(-1)


def _weighted_total(plan, leaf_rewards, weights, kind) -> torch.Tensor:
    """Σ_r w_r·R_r of each leaf of ``kind`` on its grid (float64)."""
    return sum(weights[n] * plan.gather(r, kind).double() for n, r in leaf_rewards.items())


def _flowgrpo_normalised(total: torch.Tensor, opt, *, global_std: bool) -> torch.Tensor:
    """Flow-GRPO's advantage, which Fast, TempFlow, DiffusionNFT and AWM share: the
    weighted reward normalised once per group (last dim) by the population std + 1e-4
    (or the std of every group, ``global_std``), clipped."""
    return fuse_terminal_advantages(
        {"reward": total},
        {"reward": 1.0},
        adv_clip=opt.adv_clip,
        unbiased=False,
        eps=1e-4,
        spread_tol=opt.adv_spread_tol,
        global_std=global_std,
    )


def _branch_advantages(plan, leaf_rewards, weights, adv_clip: float) -> torch.Tensor:
    """BranchGRPO: the weighted reward of each leaf, then per-depth advantages in each
    prompt's tree ([P, N]); a node's depth is its edge's position on the path."""
    total = sum(weights[n] * r.double() for n, r in leaf_rewards.items())  # per leaf
    P, N = plan.adv_shape
    out = torch.zeros(P, N, dtype=torch.float64)
    for p in range(P):
        leaves, paths = _tree_paths(plan, p)
        depth = [0] * N
        for nodes in paths:
            for d, node in enumerate(nodes):
                depth[node] = d + 1
        out[p] = tree_depth_advantages(total[leaves], paths, depth, adv_clip=adv_clip)
    return out


def _subtree_means(plan, leaf_adv: torch.Tensor) -> torch.Tensor:
    """TreeGRPO: each node's advantage is the mean advantage of the leaves below it
    ([P, G] leaves on their grid → [P, N] nodes)."""
    P, N = plan.adv_shape
    out = torch.zeros(P, N, dtype=torch.float64)
    for p in range(P):
        leaves, paths = _tree_paths(plan, p)
        columns = [plan.leaves[i].coords[1] for i in leaves]
        out[p] = subtree_means(leaf_adv[p, columns], paths, N)
    return out


def _tree_paths(plan, p: int) -> tuple[list[int], list[list[int]]]:
    """Prompt p's sample leaves (plan indices) and, for each, the tree nodes on its path:
    a node below the root is its SDE edge's advantage slot less p·N (its tree's first)."""
    N = plan.adv_shape[1]
    leaves = [i for i in plan.leaf_indices("sample") if plan.leaves[i].prompt == p]
    paths = [[e.adv_slot - p * N for e in plan.leaves[i].edges if e.adv_slot >= 0] for i in leaves]
    return leaves, paths


def plan_reward_terms(
    plan: RolloutPlan, leaf_rewards: Mapping[str, torch.Tensor], cfg: G2RPOConfig
) -> dict[str, torch.Tensor]:
    """Each reward's weighted, group-normalised addend of the advantage (before the
    clip), for logging every reward's share of the learning signal."""
    weights, opt = cfg.reward_weights(), cfg.optim
    if plan.scored_kind == "branch":
        grids = {n: plan.gather(r, "branch") for n, r in leaf_rewards.items()}
        return g2rpo_reward_terms(grids, weights, eps=opt.adv_eps, spread_tol=opt.adv_spread_tol)
    return {
        n: weights[n]
        * group_normalize(plan.gather(r, "sample"), eps=opt.adv_eps, spread_tol=opt.adv_spread_tol)
        for n, r in leaf_rewards.items()
    }
