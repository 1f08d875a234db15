"""Rollout plans: which trajectories an algorithm samples, as paths through the σ grid.

A plan is a list of leaves; each leaf is one trajectory from an initial noise (its
root) to σ=0, given as edges (target grid index, ODE or SDE with a noise row).
Leaves that share a root and an edge prefix share that part of the trajectory, so
the executor evaluates every distinct (prefix, σ) node once: the rollout is a tree.

The data model shared by the rollout engine and the learner; the builders (one per
algorithm) are in ``rollout_worker/plan.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from .sde import SDEType

LeafKind = Literal["anchor", "branch", "sample"]


@dataclass(frozen=True)
class Edge:
    """One step to grid index ``to`` from the previous node's index."""

    to: int
    noise: int = -1  # row of the SDE noise table; -1 = deterministic (ODE) step
    trained: bool = False  # the step's log-prob enters the loss
    adv_slot: int = -1  # advantage used by this transition (when trained)
    store: bool = False  # the official loop keeps this output (reference mode reuses it)
    # the step's std times this (BranchGRPO's split noise); its log-prob is that density's
    noise_scale: float = 1.0

    @property
    def stochastic(self) -> bool:
        return self.noise >= 0


@dataclass(frozen=True)
class Leaf:
    root: int
    prompt: int
    edges: tuple[Edge, ...]
    kind: LeafKind
    coords: tuple[int, ...]  # anchor: (p,); branch: (p, k_idx, g_idx, j); sample: (p, j)


@dataclass
class RolloutPlan:
    algorithm: str
    num_steps: int
    sde_type: SDEType
    eta: float
    num_prompts: int
    group_size: int
    root_prompt: list[int]  # prompt of each initial-noise row
    num_noises: int
    leaves: list[Leaf]
    adv_shape: tuple[int, ...]  # advantages are a tensor of this shape, flattened into slots
    sde_steps: list[int] = field(default_factory=list)
    granularities: list[int] = field(default_factory=list)
    # record each trained step's mean μ_old (GRPO-Guard's ratio normalisation needs it)
    keep_means: bool = False
    # hand the learner every leaf's clean latent (the forward-process methods train on them)
    keep_leaves: bool = False

    @property
    def scored_kind(self) -> LeafKind:
        """The leaves whose rewards make the advantages: a tree's branches (G²RPO,
        TempFlow-GRPO) or a baseline's samples."""
        return "branch" if self.sde_steps else "sample"

    @property
    def num_roots(self) -> int:
        return len(self.root_prompt)

    def leaf_indices(self, kind: LeafKind) -> list[int]:
        return [i for i, leaf in enumerate(self.leaves) if leaf.kind == kind]

    def gather(self, per_leaf: torch.Tensor, kind: LeafKind) -> torch.Tensor:
        """Arrange per-leaf values ([num_leaves, ...]) of one kind on their coordinate grid:
        anchor → [P, ...], branch → [P, K, J, G, ...], sample → [P, G, ...]."""
        idx = self.leaf_indices(kind)
        if not idx:
            raise ValueError(f"plan {self.algorithm!r} has no {kind} leaves")
        shape = {
            "anchor": (self.num_prompts,),
            "branch": (
                self.num_prompts,
                len(self.sde_steps),
                len(self.granularities),
                self.group_size,
            ),
            "sample": (self.num_prompts, self.group_size),
        }[kind]
        out = per_leaf.new_zeros(shape + tuple(per_leaf.shape[1:]))
        for i in idx:
            out[self.leaves[i].coords] = per_leaf[i]
        return out


def anchor_edges(num_steps: int, store: bool) -> tuple[Edge, ...]:
    return tuple(Edge(to=t, store=store) for t in range(1, num_steps + 1))


def eval_anchors(num_prompts: int, num_steps: int) -> list[Leaf]:
    """Each prompt's ODE sample from its root noise (root p): the policy's measurement,
    not training (``algorithm_nfe`` leaves it out)."""
    anchor = anchor_edges(num_steps, store=False)
    return [
        Leaf(root=p, prompt=p, edges=anchor, kind="anchor", coords=(p,)) for p in range(num_prompts)
    ]


def tree_nfe(plan: RolloutPlan, kinds: tuple[LeafKind, ...] | None = None) -> int:
    """Model evaluations of the rollout tree restricted to leaves of ``kinds`` (all
    when None): one per distinct node (root, edge prefix) that some leaf steps from."""
    nodes = {
        (leaf.root, leaf.edges[:d])
        for leaf in plan.leaves
        if kinds is None or leaf.kind in kinds
        for d in range(len(leaf.edges))
    }
    return len(nodes)


def algorithm_nfe(plan: RolloutPlan) -> int:
    """The rollout NFEs the algorithm itself needs: a baseline's ODE anchors only
    measure the policy (``anchor_reward``), so they count as evaluation, not
    training; G²RPO's anchor is the trunk its branches start from."""
    if plan.algorithm == "anchor" or plan.scored_kind == "branch":  # a tree's trunk trains
        return tree_nfe(plan)
    return tree_nfe(plan, ("sample",))
