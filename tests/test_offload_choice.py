"""``train.offload: auto`` resolved from the memory plan (planning/offload_choice.py):
the least offload with which a colocated pair's rollout, update and handoff each fit the
GPU. Known answers from the issue's own figures (issue 56: flux_hps_8gpu at 7 ranks on 80
GiB, ≈ 33 GiB learner + ≈ 45 GiB worker: both sides fit resident). On 3bb9114 there was no
choice: every iteration moved everything both ways."""

from __future__ import annotations

from pathlib import Path

import pytest
from g2rpo.common.config.loading import load_config
from g2rpo.planning.offload_choice import (
    GiB,
    PairMemory,
    choose_offload,
    pair_memory,
    resolve_offload,
    with_offload_chosen,
)

REPO = Path(__file__).resolve().parents[1]


def issue_pair(gpu_gib: float) -> PairMemory:
    """flux_hps_8gpu as `g2rpo plan` gave it at 3bb9114 (7 ranks, GiB)."""
    g = lambda x: int(x * GiB)  # noqa: E731
    return PairMemory(
        gpu=g(gpu_gib),
        worker_peak=g(45.04),
        worker_transformer=g(22.17),
        worker_residue=g(9.41),  # T5 8.87 + CLIP 0.23 + VAE 0.31
        learner_peak=g(32.77),
        learner_weights=g(6.33),  # the fp32 master shard
        learner_moments=g(12.67),
        bucket=g(0.5),
        contexts=g(3.0),
    )


@pytest.mark.parametrize(
    ("gib", "learner", "worker", "fits", "rollout", "update", "handoff"),
    [
        # 45.04 + 6.33 + 12.67 + 3 | 32.77 + 22.17 + 9.41 + 3 | 6.33 + 12.67 + 22.17 + 9.41 + .5 + 3
        (80, "none", "none", True, 67.04, 67.35, 54.08),
        # resident together is 67 GiB: the moments go (45.04 + 6.33 + 3), and the
        # transformer (32.77 + 9.41 + 3), 34.8 GiB moved, less than everything's 41.2
        (64, "optimizer", "all", True, 54.37, 45.18, 41.41),
        # even with everything offloaded the rollout needs 45.04 + 3 > 48: all, not fitting
        (48, "all", "all", False, 48.04, 45.18, 41.41),
    ],
)
def test_the_least_offload_that_fits(gib, learner, worker, fits, rollout, update, handoff):
    choice = choose_offload(issue_pair(gib))
    assert (choice.learner, choice.worker, choice.fits) == (learner, worker, fits)
    got = {k: round(v / GiB, 2) for k, v in choice.phases.items()}
    assert got == pytest.approx({"rollout": rollout, "update": update, "handoff": handoff})


def test_a_side_the_config_fixes_is_kept_and_the_other_chosen_around_it():
    learner_all = choose_offload(issue_pair(80), learner="all")
    assert (learner_all.learner, learner_all.worker, learner_all.fits) == ("all", "none", True)
    # the worker keeps its transformer: the update then needs 67.35 GiB, over 64, so
    # nothing fits and the fixed side stays as the config says
    fixed = choose_offload(issue_pair(64), worker="none")
    assert (fixed.learner, fixed.worker, fixed.fits) == ("all", "none", False)
    # something else in the pair (a reward replica: train.reward.in_pairs) takes its
    # share of each moment: 13.5 GiB more leaves neither side resident at 80
    crowded = choose_offload(PairMemory(**{**issue_pair(80).__dict__, "beside": int(13.5 * GiB)}))
    assert (crowded.learner, crowded.worker, crowded.fits) == ("optimizer", "all", True)


def test_flux_hps_8gpu_keeps_both_sides_resident_on_80_gib_by_its_own_plan():
    cfg = load_config(REPO / "configs" / "flux_hps_8gpu.yaml", ["train.memory.gpu_memory_gib=80"])
    m = pair_memory(cfg)
    assert 40 * GiB < m.worker_peak < 50 * GiB and 25 * GiB < m.learner_peak < 40 * GiB
    choice = resolve_offload(cfg)
    assert (choice.learner, choice.worker, choice.fits) == ("none", "none", True)
    chosen = with_offload_chosen(cfg)
    assert (chosen.train.offload.learner, chosen.train.offload.worker) == ("none", "none")
    assert cfg.train.offload.learner == "auto"  # the run's own config is left as it was
    # a CPU run has nothing to choose: its unresolved auto moves everything, as before
    on_cpu = load_config(None, ["train.placement=colocated"])
    assert resolve_offload(on_cpu) is None and with_offload_chosen(on_cpu) is on_cpu


def test_the_plan_counts_what_a_fixed_offload_keeps_beside_the_other_side():
    """`g2rpo plan`'s budgets for a pair whose config fixes train.offload: flux_hps_8gpu
    with both sides resident on 60 GiB does not fit (the rollout's 45.0 GiB beside the
    rank's 16.6 GiB of fp32 shard and moments and the pair's 2.8 GiB scorer), where the
    same pair on auto fits by offloading. Before, the plan's budgets assumed everything
    went to the host whatever train.offload said, and passed it."""
    from g2rpo.planning.estimate import plan

    resident = ["train.offload.learner=none", "train.offload.worker=none"]
    cfg = load_config(REPO / "configs/flux_hps_8gpu.yaml", resident)
    at60 = {a.actor: a for a in plan(cfg, 60).actors}
    worker, learner = at60["rollout worker"], at60["learner rank"]
    kept = (
        learner.parts["weights (float32 master), 1/8"]
        + learner.parts["AdamW states (2 x float32, 1/8)"]
    )
    scorer = at60["reward replica"].peak
    assert worker.budget == 60 * GiB - kept - scorer
    transformer = worker.parts["transformer weights (bfloat16)"]
    residue = sum(v for k, v in worker.parts.items() if k.startswith(("VAE", "CLIP", "T5")))
    assert learner.budget == 60 * GiB - residue - transformer - scorer
    assert not plan(cfg, 60).fits
    assert plan(cfg, 80).fits
    auto = load_config(REPO / "configs/flux_hps_8gpu.yaml")
    assert plan(auto, 60).fits  # everything may move: resolve_offload picks what fits
