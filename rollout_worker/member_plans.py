"""The member-trajectory baselines' plan builders: G full trajectories per prompt, SDE
where the method says, each member's terminal reward the advantage of each of its
trained steps (Flow-GRPO, DanceGRPO, MixGRPO, and DiffusionNFT's ODE samples).
``rollout_worker/plan.py`` picks a builder per algorithm; they do no tensor work."""

from __future__ import annotations

from typing import Literal

import torch

from ..common.algorithms.rollout_plan import Edge, Leaf, RolloutPlan, anchor_edges


def nft_plan(num_prompts: int, num_steps: int, group_size: int) -> RolloutPlan:
    """DiffusionNFT: G deterministic (ODE) samples per prompt from their own noises;
    nothing is recorded but each leaf's clean latent. The evaluation anchor of a prompt
    is its first sample's path, so it costs no NFE."""
    rows = num_prompts * group_size
    return _member_plan(
        "nft",
        num_prompts,
        num_steps,
        group_size,
        eta=0.0,
        sde_type="flow",
        stochastic=[[False] * num_steps for _ in range(rows)],
        trained=[[False] * num_steps for _ in range(rows)],
        init_same_noise=False,
        eval_anchor=True,
    )


def _member_plan(
    algorithm: str,
    num_prompts: int,
    num_steps: int,
    group_size: int,
    *,
    eta: float,
    sde_type: Literal["flow", "dance"],
    stochastic: list[list[bool]],
    trained: list[list[bool]],
    init_same_noise: bool,
    eval_anchor: bool,
) -> RolloutPlan:
    """Baselines: G full trajectories per prompt, SDE where ``stochastic[j][t]``;
    the terminal reward of member j is the advantage of each of its trained steps.
    ``stochastic``/``trained`` are indexed [p·G + j][t]."""
    leaves: list[Leaf] = []
    root_prompt: list[int] = []
    noise = 0
    if init_same_noise:
        root_prompt = list(range(num_prompts))
    for p in range(num_prompts):
        for j in range(group_size):
            row = p * group_size + j
            if init_same_noise:
                root = p
            else:
                root = len(root_prompt)
                root_prompt.append(p)
            edges = []
            for t in range(num_steps):
                if stochastic[row][t]:
                    edges.append(Edge(to=t + 1, noise=noise, trained=trained[row][t], adv_slot=row))
                    noise += 1
                else:
                    edges.append(Edge(to=t + 1))
            leaves.append(
                Leaf(root=root, prompt=p, edges=tuple(edges), kind="sample", coords=(p, j))
            )
    if eval_anchor:
        for p in range(num_prompts):
            root = p if init_same_noise else root_prompt.index(p)
            anchor = anchor_edges(num_steps, store=False)
            leaves.append(Leaf(root=root, prompt=p, edges=anchor, kind="anchor", coords=(p,)))
    return RolloutPlan(
        algorithm=algorithm,
        num_steps=num_steps,
        sde_type=sde_type,
        eta=eta,
        num_prompts=num_prompts,
        group_size=group_size,
        root_prompt=root_prompt,
        num_noises=noise,
        leaves=leaves,
        adv_shape=(num_prompts, group_size),
    )


def dancegrpo_trained_steps(
    num_steps: int, timestep_fraction: float, generator: torch.Generator
) -> list[int]:
    """DanceGRPO: a random permutation of steps 0..T−2 (the last is never trained),
    of which the first ⌊(T−1)·f⌋ are trained."""
    perm = torch.randperm(num_steps - 1, generator=generator).tolist()
    return sorted(perm[: int((num_steps - 1) * timestep_fraction)])


def dancegrpo_plan(
    num_prompts: int,
    num_steps: int,
    group_size: int,
    *,
    eta: float = 0.3,
    timestep_fraction: float = 0.6,
    generator: torch.Generator,
    eval_anchor: bool = True,
) -> RolloutPlan:
    """DanceGRPO: SDE (g ≡ η) at every step from one shared noise per prompt; each
    member trains its own random subset of steps."""
    rows = num_prompts * group_size
    trained = []
    for _ in range(rows):
        steps = set(dancegrpo_trained_steps(num_steps, timestep_fraction, generator))
        trained.append([t in steps for t in range(num_steps)])
    return _member_plan(
        "dancegrpo",
        num_prompts,
        num_steps,
        group_size,
        eta=eta,
        sde_type="dance",
        stochastic=[[True] * num_steps for _ in range(rows)],
        trained=trained,
        init_same_noise=True,
        eval_anchor=eval_anchor,
    )


def flowgrpo_plan(
    num_prompts: int,
    num_steps: int,
    group_size: int,
    *,
    eta: float = 0.7,
    train_fraction: float = 0.99,
    init_same_noise: bool = False,
    eval_anchor: bool = True,
) -> RolloutPlan:
    """Flow-GRPO: Flow-GRPO SDE at every step; the first int(T·f) steps are trained
    (f = 0.99 keeps the near-singular last step out)."""
    n_train = min(int(num_steps * train_fraction), num_steps - 1)
    rows = num_prompts * group_size
    return _member_plan(
        "flowgrpo",
        num_prompts,
        num_steps,
        group_size,
        eta=eta,
        sde_type="flow",
        stochastic=[[True] * num_steps for _ in range(rows)],
        trained=[[t < n_train for t in range(num_steps)] for _ in range(rows)],
        init_same_noise=init_same_noise,
        eval_anchor=eval_anchor,
    )


def mixgrpo_plan(
    num_prompts: int,
    num_steps: int,
    group_size: int,
    *,
    window: tuple[int, int],
    eta: float = 0.7,
    eval_anchor: bool = True,
) -> RolloutPlan:
    """MixGRPO: ODE outside the window, Flow-GRPO SDE inside it, every window step
    trained. Members share the initial noise, so the ODE prefix before the window is
    one shared trunk."""
    start, end = window
    if not 0 <= start < end <= num_steps - 1:
        raise ValueError(f"window {window} must lie within [0, T-1={num_steps - 1}]")
    rows = num_prompts * group_size
    inside = [start <= t < end for t in range(num_steps)]
    return _member_plan(
        "mixgrpo",
        num_prompts,
        num_steps,
        group_size,
        eta=eta,
        sde_type="flow",
        stochastic=[list(inside) for _ in range(rows)],
        trained=[list(inside) for _ in range(rows)],
        init_same_noise=True,
        eval_anchor=eval_anchor,
    )
