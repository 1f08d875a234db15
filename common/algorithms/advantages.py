"""Group-relative advantages and G²RPO's multi-granularity, multi-reward fusion.

    A_{p,k,g,r}^j = (R^j − mean_j R) / (std_j R + eps)       per (prompt, k, g, reward)
    A_{p,k}^j     = clip( Σ_r w_r · Σ_g A_{p,k,g,r}^j , ±adv_clip )

(Eqs. 10–12 of the paper as the official code implements them: torch's unbiased
std, eps 1e-8, unweighted sum over granularities, clamp after summation.)
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def group_normalize(
    rewards: torch.Tensor,
    dim: int = -1,
    *,
    unbiased: bool = True,
    eps: float = 1e-8,
    spread_tol: float = 0.0,
) -> torch.Tensor:
    """(r − mean)/(std + eps) along ``dim`` (the group), computed in float64.

    A group whose rewards do not spread (max − min <= spread_tol) gets exactly zero
    advantage: eps alone leaves float noise that the normalisation blows up to O(1).
    """
    if rewards.shape[dim] < 2:
        return torch.zeros_like(rewards, dtype=torch.float64)
    r = rewards.to(torch.float64)
    mean = r.mean(dim=dim, keepdim=True)
    std = r.std(dim=dim, keepdim=True, unbiased=unbiased)
    adv = (r - mean) / (std + eps)
    spread = r.amax(dim=dim, keepdim=True) - r.amin(dim=dim, keepdim=True)
    return torch.where(spread <= spread_tol, torch.zeros_like(adv), adv)


def g2rpo_reward_terms(
    rewards: Mapping[str, torch.Tensor],
    weights: Mapping[str, float],
    *,
    eps: float = 1e-8,
    spread_tol: float = 0.0,
) -> dict[str, torch.Tensor]:
    """Each reward's addend of the fused advantage, w_r · Σ_g A_{p,k,g,r}: [P, K, G]
    float64 from rewards[name] of shape [P, K, J, G] (prompt, SDE step, granularity,
    member)."""
    if not rewards:
        raise ValueError("at least one reward is needed")
    missing = set(rewards) - set(weights)
    if missing:
        raise ValueError(f"no weight given for reward(s) {sorted(missing)}")
    shapes = {name: tuple(r.shape) for name, r in rewards.items()}
    if len(set(shapes.values())) != 1 or len(next(iter(shapes.values()))) != 4:
        raise ValueError(f"rewards must all be [P, K, J, G]; got {shapes}")
    return {
        name: weights[name] * group_normalize(r, dim=-1, eps=eps, spread_tol=spread_tol).sum(dim=2)
        for name, r in rewards.items()
    }


def fuse_g2rpo_advantages(
    rewards: Mapping[str, torch.Tensor],
    weights: Mapping[str, float],
    *,
    adv_clip: float = 5.0,
    eps: float = 1e-8,
    spread_tol: float = 0.0,
) -> torch.Tensor:
    """Fuse per-branch rewards into one advantage per (prompt, k, member): the clipped
    sum of :func:`g2rpo_reward_terms`. Returns float64 [P, K, G]."""
    terms = g2rpo_reward_terms(rewards, weights, eps=eps, spread_tol=spread_tol)
    return sum(terms.values()).clamp(-adv_clip, adv_clip)


def advantage_shares(terms: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Each reward's share of the fused advantage's magnitude before clipping,
    Σ|term_r| / Σ_r' Σ|term_r'| (all zero when no group spread)."""
    mags = {name: float(t.abs().sum()) for name, t in terms.items()}
    total = sum(mags.values())
    return {name: (m / total if total > 0 else 0.0) for name, m in mags.items()}


def fuse_terminal_advantages(
    rewards: Mapping[str, torch.Tensor],
    weights: Mapping[str, float],
    *,
    adv_clip: float = 5.0,
    unbiased: bool = True,
    eps: float = 1e-8,
    spread_tol: float = 0.0,
    global_std: bool = False,
) -> torch.Tensor:
    """Baselines: one terminal reward per member, rewards[name] of shape [P, G].

    Normalised per prompt group and per reward, weighted sum, clipped (MixGRPO's
    advantage aggregation; with one reward this is DanceGRPO's/Flow-GRPO's).
    ``global_std``: Flow-GRPO's option of dividing by the std of all rewards.
    Returns float64 [P, G], broadcast by the caller to every trained step.
    """
    total = None
    for name, r in rewards.items():
        if r.ndim != 2:
            raise ValueError(f"reward {name!r} must be [P, G], got {tuple(r.shape)}")
        if global_std:
            r64 = r.to(torch.float64)
            centred = r64 - r64.mean(dim=-1, keepdim=True)
            adv = weights[name] * centred / (r64.std(unbiased=unbiased) + eps)
        else:
            adv = weights[name] * group_normalize(
                r, dim=-1, unbiased=unbiased, eps=eps, spread_tol=spread_tol
            )
        total = adv if total is None else total + adv
    if total is None:
        raise ValueError("at least one reward is needed")
    return total.clamp(-adv_clip, adv_clip)


def shuffle_within_groups(adv: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Control: permute advantages among the members of each group (last dim)."""
    flat = adv.reshape(-1, adv.shape[-1])
    perm = torch.argsort(torch.rand(flat.shape, generator=generator), dim=-1)
    return torch.gather(flat, 1, perm.to(flat.device)).reshape(adv.shape)


def subtree_means(
    leaf_values: torch.Tensor, leaf_nodes: list[list[int]], num_nodes: int
) -> torch.Tensor:
    """Each node's mean of the values of the leaves below it: BranchGRPO's node reward
    (of leaf rewards), TreeGRPO's node advantage (of normalised leaf advantages,
    newer-methods.md §5c). ``leaf_nodes[i]``: the nodes on leaf i's path; returns
    [num_nodes] float64."""
    total = torch.zeros(num_nodes, dtype=torch.float64)
    count = torch.zeros(num_nodes, dtype=torch.float64)
    v = leaf_values.to(torch.float64)
    for i, nodes in enumerate(leaf_nodes):
        total[nodes] += v[i]
        count[nodes] += 1
    if torch.any(count == 0):
        raise ValueError("every node needs a leaf below it")
    return total / count


def tree_depth_advantages(
    leaf_rewards: torch.Tensor,
    leaf_nodes: list[list[int]],
    node_depth: list[int],
    *,
    adv_clip: float = 5.0,
    eps: float = 1e-8,
    min_std: float = 1e-6,
) -> torch.Tensor:
    """BranchGRPO's per-depth advantages of one tree (``compute_node_rewards_from_leaves``,
    ``compute_hierarchical_advantages_by_depth``): a node's reward is the mean reward of
    the leaves below it, normalised over the tree's nodes of the same depth with torch's
    unbiased std + eps; zero where a depth has one node or its std < ``min_std``;
    clamped. ``leaf_nodes[i]``: the nodes on leaf i's path; returns [N] float64."""
    num_nodes = len(node_depth)
    node_reward = subtree_means(leaf_rewards, leaf_nodes, num_nodes)
    depth = torch.tensor(node_depth)
    adv = torch.zeros(num_nodes, dtype=torch.float64)
    for d in torch.unique(depth):
        at = depth == d
        if int(at.sum()) <= 1:
            continue
        vals = node_reward[at]
        std = vals.std(unbiased=True)
        if float(std) < min_std:
            continue
        adv[at] = (vals - vals.mean()) / (std + eps)
    return adv.clamp(-adv_clip, adv_clip)
