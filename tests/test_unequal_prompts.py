"""A run whose workers take unequal prompt counts (``train.workers.prompt_counts [2, 1]``)
with its reward replica inside a colocated pair's bundle (``train.reward.in_pairs``), on
the tests' local Ray, which declares GPUs it does not have (tests/servers.py): it trains,
the replica shares pair 0's GPU, and every row counts what the two plans (2 prompts, 1
prompt) and the plan's workload say. At 3bb9114 neither field existed (the config is
refused) and every worker rolled out sampling.prompts_per_worker prompts."""

from __future__ import annotations

import json

import pytest
import torch
from g2rpo.common.algorithms.rollout_plan import algorithm_nfe
from g2rpo.common.config.loading import load_config
from g2rpo.orchestration.driver import read_metrics
from g2rpo.planning.workload import workload
from g2rpo.rollout_worker.plan import plan_for
from small_run import small_train

# a training run, a Ray cluster or a service: `pytest -m 'not slow'` leaves it out
pytestmark = pytest.mark.slow

UNEQUAL = [
    "train.placement=colocated",
    "train.learner.count=2",
    "train.workers.num_gpus=0.45",
    "train.learner.num_gpus=0.45",
    "train.reward.replicas=1",
    "train.reward.num_gpus=0.1",
    "train.reward.in_pairs=true",
    "train.workers.prompt_counts=[2, 1]",
]


def _transitions(plan) -> int:
    """Distinct (state, next state) pairs of trained steps: the learner's rows."""
    return len(
        {
            (leaf.root, leaf.edges[: d + 1])
            for leaf in plan.leaves
            for d, edge in enumerate(leaf.edges)
            if edge.trained
        }
    )


def test_unequal_counts_train_with_the_replica_in_a_pair(ray_local, world, tmp_path):
    # a job-started replica (no reward_url): it is the one placed in pair 0's bundle
    run_dir = small_train(world, tmp_path, "unequal", 2, UNEQUAL)
    rows = read_metrics(run_dir)
    assert [r["iteration"] for r in rows] == [0, 1]
    cfg = load_config(run_dir / "config.yaml")
    assert cfg.train.workers.prompt_shares(cfg.sampling.prompts_per_worker) == [2, 1]
    for row in rows:
        plans = [
            plan_for(cfg, row["iteration"], torch.Generator().manual_seed(0), w) for w in (0, 1)
        ]
        assert [p.num_prompts for p in plans] == [2, 1]
        # the rollout: worker 0's two trees and worker 1's one
        assert row["nfe_rollout"] == sum(algorithm_nfe(p) for p in plans)
        assert row["nfe_rollout"] == 3 * algorithm_nfe(plans[1])
        # the update: every prompt's transitions, and the forwards the plan counts
        assert row["transitions"] == sum(_transitions(p) for p in plans)
        assert row["nfe_learn"] == workload(cfg, row["iteration"]).learner_forwards
        assert row["optimizer_steps"] == workload(cfg, row["iteration"]).optimizer_steps
    placement = json.loads((run_dir / "actors.json").read_text())["placement"]
    (replica,) = placement["reward_replicas"]
    pair0 = placement["learners"][0]["gpu_ids"]
    assert replica["gpu_ids"] == pair0 == placement["rollout_workers"][0]["gpu_ids"]
    assert replica["resources"]["GPU"] == pytest.approx(0.1)
    assert placement["learners"][1]["gpu_ids"] != pair0  # one GPU a pair
