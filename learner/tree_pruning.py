"""BranchGRPO's width pruning (Fredreic1849/BranchGRPO train_branchgrpo_flux.py,
``width_pruning_mode``): of the edges after the tree's last split (each leaf's chain),
only some are trained, chosen by advantage once the advantages are known. The rollout
and its NFEs are unchanged; the learner's forwards and backwards shrink."""

from __future__ import annotations

import torch

from ..common.wire.trajectories import Trajectories, adv_slot_offsets


def chain_of_slot(batches: list[Trajectories], last_split: int) -> dict[int, int]:
    """Advantage slot (as ``batches.merge`` offsets them) → the chain it lies on, for
    every trained edge leaving a step after ``last_split``; a chain is one sample leaf."""
    chains: dict[int, int] = {}
    chain = 0
    for b, offset in zip(batches, adv_slot_offsets(batches), strict=True):
        for i in b.plan.leaf_indices("sample"):
            for e in b.plan.leaves[i].edges:
                if e.trained and e.to - 1 > last_split:
                    chains[offset + e.adv_slot] = chain
            chain += 1
    return chains


def width_pruned_rows(
    chain: torch.Tensor, adv: torch.Tensor, mode: str, ratio: float
) -> torch.Tensor:
    """The transition rows kept, ascending. ``chain[r]``: row r's chain (−1: before the
    last split, always kept); ``adv[r]``: its advantage. branch_best (their mode 1):
    per chain the max(1, ⌊n·ratio⌋) best rows, ties to the earlier row (the shallower
    edge, as their stable sort); extremes (mode 2): over every chain edge, k =
    max(2, ⌊n·ratio⌋) rows, the ⌊k/2⌋ best and the rest from the worst."""
    keep = chain < 0
    if mode == "branch_best":
        for c in torch.unique(chain[chain >= 0]):
            rows = torch.nonzero(chain == c).flatten()
            order = torch.sort(-adv[rows], stable=True).indices
            keep[rows[order[: max(1, int(rows.numel() * ratio))]]] = True
    elif mode == "extremes":
        rows = torch.nonzero(chain >= 0).flatten()
        order = rows[torch.sort(-adv[rows], stable=True).indices]
        k = min(rows.numel(), max(2, int(rows.numel() * ratio)))
        best = k // 2
        keep[order[:best]] = True
        keep[order[rows.numel() - (k - best) :]] = True
    else:
        raise ValueError(f"width pruning mode {mode!r}: branch_best or extremes")
    return torch.nonzero(keep).flatten()
