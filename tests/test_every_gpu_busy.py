"""Every GPU busy (issue 56, item 3): reward replicas inside the colocated pairs' bundles
(``train.reward.in_pairs``), workers with unequal prompt counts
(``train.workers.prompt_counts``), a layout search that tries both, and
``configs/flux_hps_8gpu.yaml`` carrying the paper's 16 prompts on its 8 GPUs. No Ray
here: the configs, the bundles, the plans, the prompts' split and the search; the run
itself is tests/test_unequal_prompts.py. None of these fields or functions existed at
3bb9114, where each test fails (an unknown field, a missing function, or the search's
4 pairs on 5 of 8 GPUs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from g2rpo.common.algorithms.rollout_plan import tree_nfe
from g2rpo.common.config.loading import load_config
from g2rpo.common.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
GiB = 2**30
IN_PAIRS = [
    "train.placement=colocated",
    "train.workers.count=8",
    "train.learner.count=8",
    "train.workers.num_gpus=0.45",
    "train.learner.num_gpus=0.45",
    "train.reward.num_gpus=0.1",
    "train.reward.replicas=2",
    "train.reward.in_pairs=true",
]


@pytest.mark.parametrize(
    ("sets", "named"),
    [
        # catches: a count list that does not match the workers
        (["train.workers.count=2", "train.workers.prompt_counts=[2, 1, 1]"], "has 3 entries"),
        (["train.workers.count=2", "train.workers.prompt_counts=[2, 0]"], "at least one"),
        # catches: replicas placed in bundles a disaggregated run does not have
        (["train.reward.in_pairs=true"], "train.placement must be colocated"),
        # catches: more replicas than pairs, or none the job starts
        ([*IN_PAIRS, "train.reward.replicas=9"], "between 1 and the 8 pairs"),
        ([*IN_PAIRS, "train.reward.replicas=0"], "between 1 and the 8 pairs"),
        # catches: shares over the bundle's one GPU, which Ray could never place
        ([*IN_PAIRS, "train.reward.num_gpus=0.2"], "exceed the one GPU a pair's bundle holds"),
    ],
)
def test_a_layout_that_cannot_hold_is_refused_naming_the_fields(sets, named):
    with pytest.raises(ConfigError) as err:
        load_config(None, sets)
    assert named in str(err.value)
    assert "train.workers.prompt_counts" in str(err.value) or "train.reward" in str(err.value)


def test_the_iterations_prompts_split_by_each_workers_count():
    """The driver's split: worker i's share is the i-th run of its count, every prompt
    in one share; equal counts split as before (seeded runs keep their prompts)."""
    from g2rpo.orchestration.rollouts import split_prompts

    prompts = [f"p{i}" for i in range(6)]
    assert split_prompts(prompts[:3], [2, 1]) == [["p0", "p1"], ["p2"]]
    assert split_prompts(prompts, [1, 3, 2]) == [["p0"], ["p1", "p2", "p3"], ["p4", "p5"]]
    P = 2  # the old rule: prompts[i * P : (i + 1) * P]
    assert split_prompts(prompts, [P] * 3) == [prompts[i * P : (i + 1) * P] for i in range(3)]
    with pytest.raises(ValueError, match="cannot be split"):
        split_prompts(prompts, [2, 2])


def test_each_worker_plans_its_own_count():
    from g2rpo.rollout_worker.plan import plan_for

    cfg = load_config(None, ["train.workers.count=3", "train.workers.prompt_counts=[2, 1, 3]"])
    plans = [plan_for(cfg, 0, torch.Generator().manual_seed(0), w) for w in range(3)]
    assert [p.num_prompts for p in plans] == [2, 1, 3]
    # G²RPO's tree is one per prompt: NFEs in proportion to the count
    one = tree_nfe(plans[1])
    assert [tree_nfe(p) for p in plans] == [2 * one, one, 3 * one]
    with pytest.raises(ValueError, match="rollout worker 3: the run has 3 workers"):
        plan_for(cfg, 0, torch.Generator(), 3)
    # no counts: sampling.prompts_per_worker for every worker, as before
    equal = load_config(None, ["train.workers.count=2", "sampling.prompts_per_worker=2"])
    assert equal.train.workers.prompt_shares(2) == [2, 2]
    assert plan_for(equal, 0, torch.Generator(), 1).num_prompts == 2


def test_the_pairs_bundles_hold_the_reward_replicas():
    """Replica j in bundle j·pairs/replicas, that bundle holding its CPUs and custom
    resources; its GPU share is of the bundle's one GPU."""
    from g2rpo.orchestration.placement import learner_bundles

    cfg = load_config(None, [*IN_PAIRS, "train.reward.resources={scorer: 1}"])
    assert cfg.train.reward_bundles() == [0, 4]
    bundles = learner_bundles(cfg)
    pair = {"CPU": 2.0, "GPU": 1.0}
    assert bundles == [{**pair, "CPU": 3.0, "scorer": 1.0}, *[pair] * 3] * 2
    apart = load_config(None, [*IN_PAIRS, "train.reward.in_pairs=false"])
    assert apart.train.reward_bundles() == [] and learner_bundles(apart) == [pair] * 8


def test_the_plan_counts_an_in_pair_replica_in_its_gpu():
    """flux_hps_8gpu's pairs: the replica's scorers (HPS-v2.1's ViT-H and the held-out
    DFN5B CLIP's, in bf16) and its scoring batch sit on the pair's GPU through both phases;
    no GPU of its own is asked."""
    from g2rpo.planning.estimate import gpus_asked, plan

    cfg = load_config(REPO / "configs/flux_hps_8gpu.yaml")
    p = plan(cfg, 80)
    worker, learner, replica = p.actors
    scorer = 2 * 2 * 986_000_000 + 64 * 16 * 2**20  # two ViT-H's weights + a 64-image batch
    assert replica.peak == scorer and replica.count == 2
    assert worker.budget == 80 * GiB - scorer
    residue = sum(v for k, v in worker.parts.items() if k.startswith(("VAE", "CLIP", "T5")))
    assert learner.budget == 80 * GiB - residue - scorer
    # the replica fits where both phases do: the room the tighter phase leaves it
    room = min(worker.budget - worker.peak, learner.budget - learner.peak)
    assert replica.budget == scorer + room and p.fits
    assert gpus_asked(cfg) == 8 == p.gpus_asked
    # the same replicas on GPUs of their own would ask a 9th
    apart = load_config(
        REPO / "configs/flux_hps_8gpu.yaml",
        ["train.reward.in_pairs=false", "train.reward.num_gpus=0.5"],
    )
    assert gpus_asked(apart) == 9


def test_the_workload_of_unequal_counts():
    """16 prompts on 7 workers [3, 3, 2, 2, 2, 2, 2]: the rollout is the 3-prompt worker's,
    the scoring and the learner's states every prompt's."""
    from g2rpo.planning.workload import workload

    sets = ["train.workers.prompt_counts=[3, 3, 2, 2, 2, 2, 2]"]
    cfg = load_config(
        REPO / "configs/flux_hps_8gpu.yaml",
        [
            "train.workers.count=7",
            "train.learner.count=7",
            "train.reward.in_pairs=false",
            *sets,
        ],
    )
    w = workload(cfg)
    one = workload(load_config(REPO / "configs/flux_hps.yaml"))  # 1 prompt per worker
    assert w.prompts_per_worker == 3 and w.nfe_per_worker == 3 * one.nfe_per_worker
    assert w.images_per_worker == 3 * 193 and w.images_total == 16 * 193
    assert w.learner_forwards == 16 * 8  # a trained state per prompt and SDE step
    assert w.optimizer_steps == 8
    # each SDE step's 16 states on 7 ranks: 3 on the busiest, max_batch 4: one pass each
    assert w.learner_passes == 8


def test_the_layout_search_leaves_no_gpu_idle_that_a_layout_could_use():
    """flux_hps's 16 prompts on 8 GPUs: 8 colocated pairs of 2 prompts with the reward
    replicas inside two of them (3bb9114 picked 4 pairs on 5 GPUs, 3 idle: it knew
    neither replicas in pairs nor unequal counts); on 7 or 11 GPUs the prompts split
    unevenly over every pair the GPUs hold."""
    from g2rpo.planning.calibration import calibration
    from g2rpo.planning.layouts import candidate_sets, search, split_sets

    cfg = load_config(REPO / "configs/flux_hps.yaml")
    cal = calibration("H200")
    best = next(x for x in search(cfg, 8, 80, cal) if x.fits)
    assert best.idle == 0 and best.gpus == 8
    for line in (
        "train.placement=colocated",
        "train.workers.count=8",
        "train.reward.in_pairs=true",
        "sampling.prompts_per_worker=2",
    ):
        assert line in best.sets
    # every worker count up to the prompts is tried, not only divisors of 16
    counts = {s for sets in candidate_sets(cfg, 8) for s in sets if "workers.count" in s}
    assert counts == {f"train.workers.count={n}" for n in range(1, 9)}
    assert split_sets(16, 7) == [
        "sampling.prompts_per_worker=3",
        "train.workers.prompt_counts=[3, 3, 2, 2, 2, 2, 2]",
    ]
    for gpus in (7, 11):
        best = next(x for x in search(cfg, gpus, 80, cal) if x.fits)
        assert best.idle == 0 and f"train.workers.count={gpus}" in best.sets, (gpus, best)


def test_flux_hps_8gpu_carries_the_papers_16_prompts_on_8_busy_gpus():
    from g2rpo.planning.calibration import calibration
    from g2rpo.planning.estimate import plan
    from g2rpo.planning.timing import estimate_time

    cfg = load_config(REPO / "configs/flux_hps_8gpu.yaml")
    t = cfg.train
    assert sum(t.workers.prompt_shares(cfg.sampling.prompts_per_worker)) == 16
    assert t.placement == "colocated" and t.workers.count == t.learner.count == 8
    assert t.reward.in_pairs and t.reward.job_replicas() == 2
    p = plan(cfg, 80)
    assert p.fits and p.gpus_asked == 8  # every GPU a pair's, none the reward's alone
    tm = estimate_time(cfg, calibration("H200"))
    # the scores come from the pairs' GPUs, whole while their workers wait for them
    apart = estimate_time(
        load_config(
            REPO / "configs/flux_hps_8gpu.yaml",
            ["train.reward.in_pairs=false", "train.reward.num_gpus=0.5"],
        ),
        calibration("H200"),
    )
    assert tm.phases["reward"] < apart.phases["reward"]
    assert (tm.gpus, apart.gpus) == (8, 9)


def test_flux_hps_16gpu_carries_the_papers_16_prompts_on_16_busy_gpus():
    """16 pairs of 1 prompt over two nodes, a reward replica inside pair 0 and pair 8 (one
    on each node): the recipe is the layout search's best on 16 GPUs, none idle (before:
    15 pairs of 1 prompt + a reward GPU, 15 prompts)."""
    from g2rpo.planning.calibration import calibration
    from g2rpo.planning.estimate import plan
    from g2rpo.planning.layouts import search
    from g2rpo.planning.timing import estimate_time

    cfg = load_config(REPO / "configs/flux_hps_16gpu.yaml")
    t = cfg.train
    assert sum(t.workers.prompt_shares(cfg.sampling.prompts_per_worker)) == 16
    assert t.placement == "colocated" and t.workers.count == t.learner.count == 16
    assert t.reward_bundles() == [0, 8]
    p = plan(cfg, 80)
    assert p.fits and p.gpus_asked == 16
    cal = calibration("H200")
    best = next(x for x in search(cfg, 16, 80, cal) if x.fits)
    assert best.idle == 0 and best.gpus == 16
    for line in ("train.workers.count=16", "train.reward.in_pairs=true"):
        assert line in best.sets
    assert best.iteration_s == pytest.approx(estimate_time(cfg, cal).iteration_s, rel=1e-4)
