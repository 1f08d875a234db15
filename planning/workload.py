"""What one training iteration asks of each actor, counted from the config alone:
model evaluations, images, learner forwards, bytes moved. The time estimate
(``timing.py``) divides these by calibrated rates."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..common.config import G2RPOConfig
from ..common.rollout_plan import RolloutPlan, tree_nfe
from ..rollout_worker.plan import FORWARD_PROCESS, plan_for

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Workload:
    prompts_per_worker: int
    nfe_per_worker: int  # transformer sample-forwards of one worker's rollout
    images_per_worker: int  # leaves decoded and scored
    learner_forwards: int  # sample-forwards of the whole group's update
    learner_no_grad: int  # of them without a backward (old/reference velocities)
    optimizer_steps: int
    eval_samples: int  # held-out samples of one evaluation
    eval_nfe_per_sample: int


def kl_beta(cfg: G2RPOConfig) -> float:
    """The KL-to-reference weight the learner applies (learner/trainer.py's rule)."""
    a = cfg.algorithm
    return {"flowgrpo": a.flowgrpo.kl_beta, "nft": a.nft.kl_beta, "awm": a.awm.kl_beta}.get(
        a.name, 0.0
    )


def trained_states(plan: RolloutPlan) -> int:
    """Distinct states a trained step leaves from: the policy-gradient update runs one
    forward per state, shared by every transition from it (G²RPO's G branches at a step)."""
    return len(
        {
            (leaf.root, leaf.edges[:d])
            for leaf in plan.leaves
            for d, edge in enumerate(leaf.edges)
            if edge.trained
        }
    )


def forward_process_pairs(cfg: G2RPOConfig, plan: RolloutPlan) -> int:
    """(sample, grid time) pairs of NFT/AWM's update: each clean sample noised at
    ``timesteps`` times."""
    a, T = cfg.algorithm, cfg.sampling.num_steps
    per = (a.nft.timesteps or T - 1) if a.name == "nft" else a.awm.timesteps
    return len(plan.leaves) * per


def optimizer_steps(cfg: G2RPOConfig, plan: RolloutPlan) -> int:
    """Optimizer steps an iteration takes: one per trained SDE step when
    ``optim.step_mode`` is per_sde_step (the official G²RPO loop), else one."""
    if cfg.algorithm.name in FORWARD_PROCESS:
        return 1
    if cfg.optim.step_mode == "per_sde_step" and plan.sde_steps:
        return len(plan.sde_steps)
    return 1


def workload(cfg: G2RPOConfig, iteration: int = 0) -> Workload:
    """The iteration's counts (the rollout plan of ``iteration``: MixGRPO's window and
    G²RPO's step choice move with it)."""
    plan = plan_for(cfg, iteration, torch.Generator().manual_seed(cfg.run.seed))
    workers = cfg.train.workers.count
    if cfg.algorithm.name in FORWARD_PROCESS:
        pairs = forward_process_pairs(cfg, plan) * workers
        forwards, no_grad = 2 * pairs, pairs  # θ and the old copy's velocity
    else:
        forwards, no_grad = trained_states(plan) * workers, 0
    if kl_beta(cfg) > 0:  # the reference's velocity, without a backward
        half = pairs if cfg.algorithm.name in FORWARD_PROCESS else forwards
        forwards, no_grad = forwards + half, no_grad + half
    e = cfg.train.eval
    return Workload(
        prompts_per_worker=cfg.sampling.prompts_per_worker,
        nfe_per_worker=tree_nfe(plan),
        images_per_worker=len(plan.leaves),
        learner_forwards=forwards,
        learner_no_grad=no_grad,
        optimizer_steps=optimizer_steps(cfg, plan),
        eval_samples=e.samples * e.per_prompt,
        eval_nfe_per_sample=cfg.sampling.num_steps,
    )


def dtype_bytes(name: str) -> int:
    return _BYTES[name]
