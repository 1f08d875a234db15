"""What one training iteration asks of each actor, counted from the config alone:
model evaluations, images, learner forwards and the passes FSDP gathers for, bytes
moved. The time estimate (``timing.py``) divides these by calibrated rates.

Workers may take unequal prompt counts (``train.workers.prompt_counts``): the rollout's
figures are the largest share's (the slowest worker, whom the driver waits for), the
learner's are the sum over every share."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..common.algorithms.rollout_plan import RolloutPlan, tree_nfe
from ..common.config.run import G2RPOConfig
from ..rollout_worker.plan import FORWARD_PROCESS, plan_for

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Workload:
    prompts_per_worker: int  # the largest share's (the slowest worker)
    nfe_per_worker: int  # transformer sample-forwards of the largest share's rollout
    images_per_worker: int  # leaves the largest share decodes and scores
    images_total: int  # every worker's leaves, scored by the reward replicas
    learner_forwards: int  # sample-forwards of the whole group's update
    learner_no_grad: int  # of them without a backward (old/reference velocities)
    optimizer_steps: int
    # forward(+backward) passes one learner rank runs per iteration: each optimizer step's
    # states split evenly over the ranks, train.learner.max_batch states a pass; a sharded
    # rank runs as many as the busiest (learner/distributed.py RankShare.chunks)
    learner_passes: int
    eval_samples: int  # held-out samples of one evaluation
    eval_nfe_per_sample: int


@dataclass(frozen=True)
class ShareCounts:
    """One worker's rollout plan of one prompt count, counted."""

    nfe: int
    images: int
    states_by_step: tuple[tuple[int, int], ...]  # (grid index, distinct trained states)
    forward_pairs: int  # NFT/AWM's (sample, time) pairs
    sde_steps: int


def kl_beta(cfg: G2RPOConfig) -> float:
    """The KL-to-reference weight the learner applies (learner/trainer.py's rule)."""
    a = cfg.algorithm
    return {"flowgrpo": a.flowgrpo.kl_beta, "nft": a.nft.kl_beta, "awm": a.awm.kl_beta}.get(
        a.name, 0.0
    )


def states_by_step(plan: RolloutPlan) -> tuple[tuple[int, int], ...]:
    """Distinct trained states per grid index they leave from, by grid index (the
    learner's per_sde_step optimizer steps group the transitions by it)."""
    states = {
        (leaf.root, leaf.edges[:d])
        for leaf in plan.leaves
        for d, edge in enumerate(leaf.edges)
        if edge.trained
    }
    counts: dict[int, int] = {}
    for _, prefix in states:
        step = prefix[-1].to if prefix else 0
        counts[step] = counts.get(step, 0) + 1
    return tuple(sorted(counts.items()))


def forward_process_pairs(cfg: G2RPOConfig, plan: RolloutPlan) -> int:
    """(sample, grid time) pairs of NFT/AWM's update: each clean sample noised at
    ``timesteps`` times."""
    a, T = cfg.algorithm, cfg.sampling.num_steps
    per = (a.nft.timesteps or T - 1) if a.name == "nft" else a.awm.timesteps
    return len(plan.leaves) * per


_SHARES: dict[tuple[str, int, int], ShareCounts] = {}


def share_counts(cfg: G2RPOConfig, iteration: int, prompts: int) -> ShareCounts:
    """The counts of a worker's plan of ``prompts`` prompts at ``iteration``. A plan
    depends on the model, sampling, algorithm, optimiser and run sections and the count
    alone, so layouts that differ elsewhere share one count (`g2rpo plan --gpus N`
    compares a hundred layouts of one batch)."""
    include = {"model", "sampling", "algorithm", "optim", "run"}
    key = (cfg.model_dump_json(include=include), iteration, prompts)
    if key not in _SHARES:
        one = cfg.train.workers.model_copy(update={"count": 1, "prompt_counts": [prompts]})
        alone = cfg.model_copy(update={"train": cfg.train.model_copy(update={"workers": one})})
        plan = plan_for(alone, iteration, torch.Generator().manual_seed(cfg.run.seed))
        noised = cfg.algorithm.name in FORWARD_PROCESS
        if len(_SHARES) > 4096:  # a long-lived process planning many configs
            _SHARES.clear()
        _SHARES[key] = ShareCounts(
            nfe=tree_nfe(plan),
            images=len(plan.leaves),
            states_by_step=states_by_step(plan),
            forward_pairs=forward_process_pairs(cfg, plan) if noised else 0,
            sde_steps=len(plan.sde_steps),
        )
    return _SHARES[key]


def learner_passes(step_states: list[int], ranks: int, max_batch: int) -> int:
    """Passes of the busiest rank: per optimizer step, its states split into ``ranks``
    near-equal parts, at most ``max_batch`` states a pass."""
    return sum(math.ceil(math.ceil(s / ranks) / max_batch) for s in step_states if s > 0)


def workload(cfg: G2RPOConfig, iteration: int = 0) -> Workload:
    """The iteration's counts (the rollout plans of ``iteration``: MixGRPO's window and
    G²RPO's step choice move with it), over every worker's share of the prompts."""
    shares = cfg.train.workers.prompt_shares(cfg.sampling.prompts_per_worker)
    counts = {p: share_counts(cfg, iteration, p) for p in set(shares)}
    largest = max(shares)
    per = [counts[p] for p in shares]
    t = cfg.train
    if cfg.algorithm.name in FORWARD_PROCESS:
        pairs = sum(c.forward_pairs for c in per)
        forwards, no_grad = 2 * pairs, pairs  # θ and the old copy's velocity
        step_states = [pairs]  # each pair its own "state", one optimizer step
    else:
        by_step: dict[int, int] = {}
        for c in per:
            for step, n in c.states_by_step:
                by_step[step] = by_step.get(step, 0) + n
        forwards, no_grad = sum(by_step.values()), 0
        stepwise = cfg.optim.step_mode == "per_sde_step" and counts[largest].sde_steps
        step_states = list(by_step.values()) if stepwise else [forwards]
    if kl_beta(cfg) > 0:  # the reference's velocity, without a backward
        half = pairs if cfg.algorithm.name in FORWARD_PROCESS else forwards
        forwards, no_grad = forwards + half, no_grad + half
    steps = len(step_states) if cfg.algorithm.name not in FORWARD_PROCESS else 1
    e = t.eval
    return Workload(
        prompts_per_worker=largest,
        nfe_per_worker=counts[largest].nfe,
        images_per_worker=counts[largest].images,
        images_total=sum(c.images for c in per),
        learner_forwards=forwards,
        learner_no_grad=no_grad,
        optimizer_steps=steps,
        learner_passes=learner_passes(step_states, t.learner.count, t.learner.max_batch),
        eval_samples=e.samples * e.per_prompt,
        eval_nfe_per_sample=cfg.sampling.num_steps,
    )


def dtype_bytes(name: str) -> int:
    return _BYTES[name]
