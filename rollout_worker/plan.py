"""Rollout plan builders: which trajectories each algorithm samples, as paths through
the σ grid (the plan itself: ``common/algorithms/rollout_plan.py``).

A plan is a list of leaves; each leaf is one trajectory from an initial noise (its
root) to σ=0, given as edges (target grid index, ODE or SDE with a noise row).
Leaves that share a root and an edge prefix share that part of the trajectory, so
the executor evaluates every distinct (prefix, σ) node once: the rollout is a tree.

Builders here (and the baselines' in member_plans.py, the trees' in tree_plans.py)
encode each algorithm's sampling scheme; they do no tensor work.
"""

from __future__ import annotations

import torch

from ..common.algorithms.rollout_plan import Edge, Leaf, RolloutPlan, anchor_edges, eval_anchors
from ..common.algorithms.schedules import Terminal, completion_indices
from ..common.config.algorithm import FORWARD_PROCESS
from .member_plans import dancegrpo_plan, flowgrpo_plan, mixgrpo_plan, nft_plan
from .step_windows import g2rpo_branch_steps, mixgrpo_window
from .tree_plans import branchgrpo_plan, treegrpo_plan, treegrpo_start


def anchor_plan(num_prompts: int, num_steps: int) -> RolloutPlan:
    """Deterministic ODE samples only, one per prompt (evaluation of the current policy)."""
    anchor = anchor_edges(num_steps, store=False)
    return RolloutPlan(
        algorithm="anchor",
        num_steps=num_steps,
        sde_type="flow",
        eta=0.0,
        num_prompts=num_prompts,
        group_size=1,
        root_prompt=list(range(num_prompts)),
        num_noises=0,
        leaves=[
            Leaf(root=p, prompt=p, edges=anchor, kind="anchor", coords=(p,))
            for p in range(num_prompts)
        ],
        adv_shape=(0,),
    )


def g2rpo_plan(
    num_prompts: int,
    num_steps: int,
    group_size: int,
    sde_steps: list[int],
    granularities: list[int],
    *,
    eta: float = 0.7,
    terminal: Terminal = "exact",
) -> RolloutPlan:
    """Singular stochastic sampling with multi-granularity completion (G²RPO).

    Per prompt: one ODE anchor from the shared noise; for each SDE step k and member
    j one SDE step off anchor x_k (noise row per (p, k, j)), completed by ODE on each
    granularity's grid. Leaves are listed in the official loop order (anchor, then
    member → k → g) so that reference mode replays that order.
    """
    leaves: list[Leaf] = []
    K = len(sde_steps)
    anchor = anchor_edges(num_steps, store=True)
    for p in range(num_prompts):
        leaves.append(Leaf(root=p, prompt=p, edges=anchor, kind="anchor", coords=(p,)))
    completions = {
        (k, g): completion_indices(k, g, num_steps, terminal)
        for k in sde_steps
        for g in granularities
    }
    for p in range(num_prompts):
        for j in range(group_size):
            for ki, k in enumerate(sde_steps):
                slot = (p * K + ki) * group_size + j
                sde = Edge(to=k + 1, noise=slot, trained=True, adv_slot=slot, store=True)
                for gi, g in enumerate(granularities):
                    rest = tuple(Edge(to=t) for t in completions[(k, g)][1:])
                    leaves.append(
                        Leaf(
                            root=p,
                            prompt=p,
                            edges=(*anchor[:k], sde, *rest),
                            kind="branch",
                            coords=(p, ki, gi, j),
                        )
                    )
    return RolloutPlan(
        algorithm="g2rpo",
        num_steps=num_steps,
        sde_type="flow",
        eta=eta,
        num_prompts=num_prompts,
        group_size=group_size,
        root_prompt=list(range(num_prompts)),
        num_noises=num_prompts * K * group_size,
        leaves=leaves,
        adv_shape=(num_prompts, K, group_size),
        sde_steps=list(sde_steps),
        granularities=list(granularities),
    )


def tempflow_plan(
    num_prompts: int,
    num_steps: int,
    group_size: int,
    sde_steps: list[int],
    *,
    eta: float = 0.7,
    terminal: Terminal = "exact",
) -> RolloutPlan:
    """TempFlow-GRPO (arXiv 2508.04324): an ODE anchor per prompt, G SDE children at
    each branch step, each completed by ODE on the full grid: G²RPO's tree with the
    one granularity 1. Its advantages are normalised per (prompt, step) as Flow-GRPO
    normalises (``learner/advantages.py``); its loss weighs steps by their noise."""
    plan = g2rpo_plan(
        num_prompts, num_steps, group_size, sde_steps, [1], eta=eta, terminal=terminal
    )
    plan.algorithm = "tempflow"
    return plan


def flowgrpo_fast_plan(
    num_prompts: int,
    num_steps: int,
    group_size: int,
    *,
    window: int,
    branch_steps: list[int],
    eta: float = 0.7,
    eval_anchor: bool = True,
) -> RolloutPlan:
    """Flow-GRPO-Fast as its original code samples (flow_grpo @a2832cc): per prompt
    one ODE trunk from one noise to step k = ``branch_steps[p]``; there G branches take
    ``window`` SDE steps (their own noise rows, all trained with the leaf's advantage)
    and finish by ODE. The group is the G leaves of one trunk (the code's 18-leaf
    groups mixed two trunks; here one trunk, one k shared by its branches)."""
    if len(branch_steps) != num_prompts:
        raise ValueError(f"one branch step per prompt: {len(branch_steps)} for {num_prompts}")
    leaves: list[Leaf] = []
    noise = 0
    anchor = anchor_edges(num_steps, store=False)
    for p, k in enumerate(branch_steps):
        if not 0 <= k <= num_steps - 1 - window:
            raise ValueError(f"branch step {k} + window {window} runs past step {num_steps - 2}")
        for j in range(group_size):
            row = p * group_size + j
            sde = []
            for t in range(k, k + window):
                sde.append(Edge(to=t + 1, noise=noise, trained=True, adv_slot=row))
                noise += 1
            rest = tuple(Edge(to=t) for t in range(k + window + 1, num_steps + 1))
            edges = (*anchor[:k], *sde, *rest)
            leaves.append(Leaf(root=p, prompt=p, edges=edges, kind="sample", coords=(p, j)))
    if eval_anchor:
        leaves += eval_anchors(num_prompts, num_steps)
    return RolloutPlan(
        algorithm="flowgrpo_fast",
        num_steps=num_steps,
        sde_type="flow",
        eta=eta,
        num_prompts=num_prompts,
        group_size=group_size,
        root_prompt=list(range(num_prompts)),
        num_noises=noise,
        leaves=leaves,
        adv_shape=(num_prompts, group_size),
    )


def plan_for(cfg, iteration: int, generator: torch.Generator, worker: int = 0) -> RolloutPlan:
    """The rollout plan of ``cfg.algorithm`` at a given iteration (cfg: G2RPOConfig) for
    rollout worker ``worker``, whose share of the iteration's prompts it spans
    (``train.workers.prompt_counts``, else ``sampling.prompts_per_worker``), its
    stochastic steps of ``cfg.sde_type()`` (the method's own SDE, or CPS)."""
    shares = cfg.train.workers.prompt_shares(cfg.sampling.prompts_per_worker)
    if not 0 <= worker < len(shares):
        raise ValueError(f"rollout worker {worker}: the run has {len(shares)} workers")
    plan = _method_plan(cfg, iteration, generator, shares[worker])
    plan.sde_type = cfg.sde_type()
    plan.keep_means = cfg.optim.loss == "grpo_guard"
    plan.keep_leaves = cfg.algorithm.name in FORWARD_PROCESS
    return plan


def _method_plan(cfg, iteration: int, generator: torch.Generator, prompts: int) -> RolloutPlan:
    s, algo = cfg.sampling, cfg.algorithm
    P, T, G = prompts, s.num_steps, s.group_size
    if algo.name == "g2rpo":
        o = algo.g2rpo
        per, choice, every = o.steps_per_iteration, o.step_choice, o.slide_every
        steps = g2rpo_branch_steps(s.sde_steps, iteration, cfg.run.seed, per, choice, every)
        return g2rpo_plan(P, T, G, steps, s.granularities, eta=s.eta, terminal=s.terminal)
    if algo.name == "dancegrpo":
        return dancegrpo_plan(
            P,
            T,
            G,
            eta=s.eta,
            timestep_fraction=algo.dancegrpo.timestep_fraction,
            generator=generator,
        )
    if algo.name == "flowgrpo":
        o = algo.flowgrpo
        return flowgrpo_plan(
            P, T, G, eta=s.eta, train_fraction=o.train_fraction, init_same_noise=o.init_same_noise
        )
    if algo.name == "mixgrpo":
        o = algo.mixgrpo
        window = mixgrpo_window(iteration, T, o.window_size, o.shift_every, o.stride, o.roll_back)
        return mixgrpo_plan(P, T, G, window=window, eta=s.eta)
    if algo.name in FORWARD_PROCESS:
        plan = nft_plan(P, T, G)
        plan.algorithm = algo.name
        return plan
    if algo.name == "branchgrpo":
        o = algo.branchgrpo
        return branchgrpo_plan(
            P,
            T,
            o.split_steps,
            eta=s.eta,
            prune_depths=o.prune_depths if cfg.branch_pruning_active(iteration) else (),
            split_noise_scale=o.split_noise_scale,
        )
    if algo.name == "treegrpo":
        o = algo.treegrpo
        start = treegrpo_start(iteration, T, o.depth, o.start, o.slide_every)
        return treegrpo_plan(P, T, o.depth, start=start, eta=s.eta)
    if algo.name == "tempflow":
        return tempflow_plan(P, T, G, s.sde_steps, eta=s.eta, terminal=s.terminal)
    if algo.name == "flowgrpo_fast":
        high = cfg.fast_branch_max()
        branch = torch.randint(0, high + 1, (P,), generator=generator).tolist()
        return flowgrpo_fast_plan(
            P, T, G, window=algo.flowgrpo_fast.window, branch_steps=branch, eta=s.eta
        )
    raise ValueError(f"unknown algorithm {algo.name!r}")
