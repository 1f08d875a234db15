"""2 iterations of each newer method (tests/test_newer_methods.py and test_treegrpo.py
have their math) through the Ray path: the session's warm actors, its reward server,
the committed world."""

from __future__ import annotations

import math

import pytest
import torch
from small_run import PROMPTS_PER_WORKER, small_train

# a training run, a Ray cluster or a service: `pytest -m 'not slow'` leaves it out
pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("name", "extra", "transitions"),
    [
        # Fast on CPS: 2 workers · their prompts · G=4 · window 2
        (
            "fast-cps",
            [
                "algorithm.name=flowgrpo_fast",
                "algorithm.flowgrpo_fast.branch_max=2",
                "sampling.sde_type=cps",
                "sampling.eta=0.8",
            ],
            2 * PROMPTS_PER_WORKER * 4 * 2,
        ),
        # BranchGRPO: 2 workers · their prompts · 20 edges (splits {0, 2} at T=6: 2+2+4+4+4+4),
        # of which width pruning (branch_best, ½) trains 1 of each leaf's 3 chain edges
        (
            "branch",
            [
                "algorithm.name=branchgrpo",
                "algorithm.branchgrpo.split_steps=[0,2]",
                "algorithm.branchgrpo.width_pruning=branch_best",
                "sampling.eta=0.3",
                "optim.step_mode=per_samples",
                "optim.samples_per_step=12",
            ],
            2 * PROMPTS_PER_WORKER * (20 - 4 * 2),
        ),
        # TreeGRPO: 2 workers · their prompts · 6 edges (a 2-deep window: 2 + 4), the window
        # one step later in iteration 1
        (
            "tree",
            [
                "algorithm.name=treegrpo",
                "algorithm.treegrpo.depth=2",
                "algorithm.treegrpo.slide_every=1",
            ],
            2 * PROMPTS_PER_WORKER * 6,
        ),
        # DiffusionNFT: its "transitions" are the 2 workers · their prompts · G=4 clean samples
        ("nft", ["algorithm.name=nft", "optim.step_mode=accumulate"], 2 * PROMPTS_PER_WORKER * 4),
        # AWM: the same clean samples, its advantage-weighted flow-matching loss
        ("awm", ["algorithm.name=awm", "algorithm.awm.timesteps=3"], 2 * PROMPTS_PER_WORKER * 4),
        # TempFlow with GRPO-Guard's loss: 2 workers · their prompts · 2 branch steps · G=4
        (
            "tempflow-guard",
            [
                "algorithm.name=tempflow",
                "sampling.granularities=[1]",
                "optim.loss=grpo_guard",
                "optim.clip_range=4e-6",
            ],
            2 * PROMPTS_PER_WORKER * 2 * 4,
        ),
    ],
)
def test_two_iterations_through_the_ray_path(
    warm, world, scorer_url, tmp_path, name, extra, transitions
):
    from g2rpo.common.algorithms.rollout_plan import algorithm_nfe
    from g2rpo.common.algorithms.seeds import seed_for
    from g2rpo.common.config.loading import load_config
    from g2rpo.orchestration.driver import read_metrics
    from g2rpo.rollout_worker.plan import plan_for

    # evaluated before training and after it, checkpointed once, at the end
    once = ["train.eval.every=2", "train.checkpoints.every=2"]
    run = small_train(world, tmp_path, name, 2, [*extra, *once], warm=warm, reward_url=scorer_url)
    rows = read_metrics(run)
    cfg = load_config(run / "config.yaml")
    assert [r["iteration"] for r in rows] == [0, 1]
    for r in rows:
        assert r["transitions"] == transitions
        assert math.isfinite(r["loss"]) and r["optimizer_steps"] >= 1
        # the rollout spent exactly what the workers' plans say (their noise, their k)
        plans = [
            plan_for(
                cfg,
                r["iteration"],
                torch.Generator().manual_seed(seed_for(cfg.run.seed, r["iteration"], w)),
            )
            for w in range(cfg.train.workers.count)
        ]
        assert r["nfe_rollout"] == sum(algorithm_nfe(p) for p in plans)
    assert math.isfinite(rows[0]["eval/shapes_clip"])
    assert (run / "evals" / "it_00002.json").is_file() and (run / "final").is_dir()
