"""BranchGRPO in the same engine (../shared/docs/newer-methods.md): its tree's NFEs and
trained edges as the doc counts them, depth and width pruning, per-depth advantages, split
noise drawn and scored at its scale (the other newer methods: tests/test_newer_methods.py;
2 iterations through the Ray path: tests/test_newer_methods_training.py)."""

from __future__ import annotations

import math

import pytest
import torch
from g2rpo.common.algorithms.rollout_plan import algorithm_nfe
from g2rpo.common.algorithms.sde import gaussian_log_prob
from g2rpo.common.config.loading import load_config
from g2rpo.common.errors import ConfigError
from g2rpo.rollout_worker.plan import plan_for

F64 = torch.float64


def test_branchgrpo_tree_nfe_and_edges_match_the_docs_count():
    """Splits {0, 3, 6, 9}: 139 node forwards and 154 trained edges per tree at T=16, 203
    and 218 at the official T=20 (newer-methods.md §13, §4g); 16 leaves, SDE on every
    edge, each edge's slot its node's."""
    from g2rpo.rollout_worker.tree_plans import branchgrpo_plan

    for steps, nfe, edges in ((16, 139, 154), (20, 203, 218)):
        plan = branchgrpo_plan(2, steps, [0, 3, 6, 9])
        assert algorithm_nfe(plan) == 2 * nfe and plan.adv_shape == (2, edges)
        assert plan.group_size == 16 and len(plan.leaf_indices("sample")) == 32
        trained = {(leaf.root, e.adv_slot) for leaf in plan.leaves for e in leaf.edges if e.trained}
        assert len(trained) == 2 * edges
        assert all(e.stochastic for i in plan.leaf_indices("sample") for e in plan.leaves[i].edges)


def test_branchgrpo_depth_pruning_trains_fewer_edges_of_the_same_rollout():
    """DepPru: the tree and its noise are unchanged (same NFEs), edges into the pruned
    depths are not trained: at T=16 with splits {0, 3, 6, 9}, pruning depths 11..16
    drops 6 x 16 of the 154 edges."""
    from g2rpo.rollout_worker.tree_plans import branchgrpo_plan

    full = branchgrpo_plan(1, 16, [0, 3, 6, 9])
    pruned = branchgrpo_plan(1, 16, [0, 3, 6, 9], prune_depths=[11, 12, 13, 14, 15, 16])
    assert algorithm_nfe(pruned) == algorithm_nfe(full) == 139
    trained = {e.adv_slot for leaf in pruned.leaves for e in leaf.edges if e.trained}
    assert len(trained) == 154 - 6 * 16
    with pytest.raises(ConfigError, match=r"algorithm\.branchgrpo\.prune_depths"):
        load_config(
            None,
            [
                "algorithm.name=branchgrpo",
                "sampling.group_size=16",
                "algorithm.branchgrpo.prune_depths=[0]",
            ],
        )


def test_branchgrpo_advantages_per_depth_known_answer():
    """T=2, splits {0, 1}: depth-1 nodes a (leaves 1, 2) and b (leaves 3, 5) have rewards
    1.5 and 4, normalised with the unbiased std of two values: ∓0.7071 whatever the gap
    (the doc's pitfall 2); the leaves are normalised among themselves."""
    from g2rpo.learner.advantages import plan_advantages
    from g2rpo.rollout_worker.tree_plans import branchgrpo_plan

    plan = branchgrpo_plan(1, 2, [0, 1], eval_anchor=False)
    cfg = load_config(
        None,
        [
            "algorithm.name=branchgrpo",
            "sampling.num_steps=2",
            "sampling.sde_steps=[0]",
            "algorithm.branchgrpo.split_steps=[0,1]",
            "sampling.group_size=4",
        ],
    )
    rewards = torch.tensor([1.0, 2.0, 3.0, 5.0], dtype=F64)
    adv = plan_advantages(plan, {"shapes_clip": rewards}, cfg)
    by_slot = {}
    for i in plan.leaf_indices("sample"):
        for d, e in enumerate(plan.leaves[i].edges):
            by_slot[e.adv_slot] = (d, i)
    depth1 = sorted(float(adv[s]) for s, (d, _) in by_slot.items() if d == 0)
    assert depth1 == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)])
    leaf_adv = {i: float(adv[s]) for s, (d, i) in by_slot.items() if d == 1}
    expected = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
    assert [leaf_adv[i] for i in sorted(leaf_adv)] == pytest.approx(expected.tolist())
    flat = plan_advantages(plan, {"shapes_clip": torch.ones(4, dtype=F64)}, cfg)
    assert torch.equal(flat, torch.zeros_like(flat))  # no spread at any depth: zero
    with pytest.raises(ConfigError, match=r"sampling\.group_size 8: BranchGRPO"):
        load_config(None, ["algorithm.name=branchgrpo", "sampling.group_size=8"])
    with pytest.raises(ConfigError, match="CPS adds no noise"):
        load_config(
            None, ["algorithm.name=branchgrpo", "sampling.group_size=16", "sampling.sde_type=cps"]
        )


def test_branchgrpo_split_noise_is_drawn_and_scored_at_its_scale(tiny_flux):
    """Split edges draw their noise at split_noise_scale × the std (their 4.0) and record
    the log-prob of that density, so the learner's recompute before any update gives
    ratio 1 on every edge; at the unscaled std (their code's log-prob: newer-methods.md
    §4g.1) the split edges' log-probs differ, the chain edges' do not."""
    from conftest import flux_cond
    from g2rpo.common.algorithms.schedules import sampling_grid
    from g2rpo.common.algorithms.sde import step_coefficients
    from g2rpo.learner.grpo import StepSpec, recompute_log_probs
    from g2rpo.rollout_worker.engine import RolloutEngine, draw_noise
    from g2rpo.rollout_worker.tree_plans import branchgrpo_plan

    plan = branchgrpo_plan(1, 4, [0, 2], eta=0.3, split_noise_scale=4.0, eval_anchor=False)
    scales = {e.to - 1: e.noise_scale for leaf in plan.leaves for e in leaf.edges}
    assert scales == {0: 4.0, 1: 1.0, 2: 4.0, 3: 1.0}
    default = plan_for(
        load_config(None, ["algorithm.name=branchgrpo", "sampling.group_size=16"]),
        0,
        torch.Generator().manual_seed(0),
    )
    assert {e.noise_scale for e in default.leaves[0].edges if e.to - 1 in (0, 3, 6, 9)} == {4.0}
    grid = sampling_grid(4, 3.0)
    init, sde = draw_noise(plan, (4, 64), torch.Generator().manual_seed(0))
    tr = RolloutEngine(tiny_flux, grid).run(plan, flux_cond(1), init, sde).transitions
    rows = torch.arange(len(tr))
    split = torch.isin(tr.state_step[tr.state_index], torch.tensor([0, 2]))
    assert tr.noise_scale.tolist() == [4.0 if s else 1.0 for s in split.tolist()]
    spec = StepSpec(grid=grid, eta=0.3, sde_type="dance")
    log_prob, mean, _ = recompute_log_probs(tiny_flux, tr, rows, flux_cond(1), spec)
    torch.testing.assert_close(log_prob, tr.old_log_probs, rtol=0, atol=1e-6)
    sig = grid.sigmas
    std = step_coefficients(
        sig[tr.state_step[tr.state_index]], sig[tr.next_step], 0.3, "dance", float(sig[1])
    ).std
    unscaled = gaussian_log_prob(tr.next_samples, mean, std)
    assert torch.all((unscaled - tr.old_log_probs).abs()[split] > 1e-3)
    torch.testing.assert_close(unscaled[~split], tr.old_log_probs[~split], rtol=0, atol=1e-6)


def test_branchgrpo_width_pruning_keeps_what_their_two_modes_keep():
    """Chain edges (after the last split) only; rows before it (chain −1) always stay.
    branch_best (mode 1), ratio ½: per chain max(1, ⌊n/2⌋) best rows, ties to the earlier
    (shallower) row; extremes (mode 2): k = max(2, ⌊n/2⌋) rows over all chains, ⌊k/2⌋
    best and the rest from the worst."""
    from g2rpo.learner.tree_pruning import width_pruned_rows

    chain = torch.tensor([-1, 0, 0, 0, 0, 1, 1, 1, -1])
    adv = torch.tensor([9.0, 0.5, 0.5, 0.5, 0.5, 1.0, 3.0, 2.0, -9.0])
    kept = width_pruned_rows(chain, adv, "branch_best", 0.5)
    assert kept.tolist() == [0, 1, 2, 6, 8]  # chain 0: its first two; chain 1: ⌊1.5⌋ = 1
    chain = torch.tensor([-1, *([0] * 5), *([1] * 5)])
    adv = torch.tensor([0.0, *range(10)], dtype=torch.float64)  # rows 1..10 hold 0..9
    kept = width_pruned_rows(chain, adv, "extremes", 0.5)
    assert kept.tolist() == [0, 1, 2, 3, 9, 10]  # the worst 3 (0, 1, 2), the best 2 (8, 9)
    assert width_pruned_rows(chain, adv, "extremes", 0.05).tolist() == [0, 1, 10]  # k >= 2


def test_branchgrpo_width_pruning_finds_each_leafs_chain_and_stops_at_prune_until():
    """T=6, splits {0, 2}: per tree 20 edges, of which the 12 leaving steps 3..5 lie on
    the 4 leaves' chains (3 each); pruning (depth too) applies while iteration <=
    ⌊prune_until × run.iterations⌋."""
    from types import SimpleNamespace

    from g2rpo.learner.tree_pruning import chain_of_slot
    from g2rpo.rollout_worker.tree_plans import branchgrpo_plan

    plans = [branchgrpo_plan(2, 6, [0, 2]), branchgrpo_plan(1, 6, [0, 2])]
    chains = chain_of_slot([SimpleNamespace(plan=p) for p in plans], last_split=2)
    assert len(chains) == 3 * 12 and sorted(set(chains.values())) == list(range(12))
    assert all(list(chains.values()).count(c) == 3 for c in range(12))
    assert min(chains) >= 0 and max(chains) < 2 * 20 + 20  # the second plan's slots offset
    cfg = load_config(
        None,
        [
            "algorithm.name=branchgrpo",
            "algorithm.branchgrpo.split_steps=[0,2]",
            "algorithm.branchgrpo.prune_depths=[6]",
            "algorithm.branchgrpo.prune_until=0.5",
            "sampling.group_size=4",
            "sampling.num_steps=6",
            "sampling.sde_steps=[0]",
            "sampling.prompts_per_worker=1",
            "run.iterations=10",
        ],
    )
    assert [cfg.branch_pruning_active(i) for i in (0, 5, 6)] == [True, True, False]

    def trained(it):
        plan = plan_for(cfg, it, torch.Generator().manual_seed(0))
        return len({e.adv_slot for leaf in plan.leaves for e in leaf.edges if e.trained})

    assert (trained(5), trained(6)) == (20 - 4, 20)  # the 4 edges into depth 6 pruned
