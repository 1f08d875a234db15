"""TreeGRPO in the same engine (../shared/docs/newer-methods.md §5, from a secondary
walkthrough of its code): the plan's trunk, window and completion, its NFEs and
learner forwards as the doc counts them, the sliding window, and the subtree-mean
advantages (2 iterations through the Ray path: tests/test_newer_methods_training.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import flux_cond
from g2rpo.common.algorithms.rollout_plan import algorithm_nfe
from g2rpo.common.config.loading import load_config
from g2rpo.common.errors import ConfigError
from g2rpo.rollout_worker.plan import plan_for
from g2rpo.rollout_worker.tree_plans import treegrpo_plan, treegrpo_start

F64 = torch.float64


def test_treegrpo_plan_trunk_window_and_completion():
    """T=10, w=4 from step 2: an ODE trunk of 2 forwards, 1+2+4+8 = 15 window nodes,
    16 leaves completed by ODE over the 4 steps left: 2 + 15 + 64 = 81 forwards per
    tree; 30 trained SDE edges (2 per internal node), each with its own slot."""
    plan = treegrpo_plan(2, 10, 4, start=2)
    assert plan.group_size == 16 and plan.adv_shape == (2, 30)
    assert algorithm_nfe(plan) == 2 * (2 + 15 + 16 * 4)
    samples = [plan.leaves[i] for i in plan.leaf_indices("sample")]
    assert len(samples) == 32
    for leaf in samples:
        assert [e.to for e in leaf.edges] == list(range(1, 11))
        assert [e.stochastic for e in leaf.edges] == [False] * 2 + [True] * 4 + [False] * 4
        assert [e.trained for e in leaf.edges] == [e.stochastic for e in leaf.edges]
    slots = {(leaf.root, e.adv_slot) for leaf in samples for e in leaf.edges if e.trained}
    assert len(slots) == 2 * 30
    # the eval anchor shares the tree's trunk: the measurement costs only its tail
    assert len(plan.leaf_indices("anchor")) == 2


def test_one_learner_forward_per_internal_node(tiny_flux):
    """The two children of a node start from its state: the learner's transitions are
    the 30 edges, their distinct states the 15 internal nodes (TreeGRPO's amortised
    training, one forward per branching node)."""
    from g2rpo.common.algorithms.schedules import sampling_grid
    from g2rpo.rollout_worker.engine import RolloutEngine, draw_noise

    plan = treegrpo_plan(1, 6, 4, start=1, eval_anchor=False)
    gen = torch.Generator().manual_seed(0)
    init, sde = draw_noise(plan, (4, 64), gen)
    tr = RolloutEngine(tiny_flux, sampling_grid(6, 3.0)).run(plan, flux_cond(1), init, sde)
    tr = tr.transitions
    assert len(tr) == 30 and len(tr.states) == 15
    # each state is the parent of exactly its two children
    assert torch.bincount(tr.state_index).tolist() == [2] * 15


def test_the_window_slides_one_step_every_slide_every_iterations_and_stops():
    assert [treegrpo_start(i, 10, 4, 0, 50) for i in (0, 49, 50, 120, 10_000)] == [0, 0, 1, 2, 5]
    assert treegrpo_start(10_000, 10, 4, 3, 0) == 3  # 0: fixed
    cfg = load_config(
        None,
        [
            "algorithm.name=treegrpo",
            "algorithm.treegrpo.depth=2",
            "algorithm.treegrpo.slide_every=2",
            "sampling.group_size=4",
            "sampling.num_steps=6",
            "sampling.sde_steps=[0]",
            "sampling.prompts_per_worker=1",
        ],
    )
    firsts = []
    for it in range(10):
        plan = plan_for(cfg, it, torch.Generator().manual_seed(0))
        edges = plan.leaves[plan.leaf_indices("sample")[0]].edges
        firsts.append([e.stochastic for e in edges].index(True))
    assert firsts == [0, 0, 1, 1, 2, 2, 3, 3, 3, 3]  # T-1-w = 3 is the last start


def test_subtree_mean_advantages_known_answer():
    """w=2 (4 leaves), rewards 1, 2, 3, 6: Flow-GRPO's normalisation (population std
    √3.5, + 1e-4) gives the leaves' A; each depth-1 node gets the mean A of its two
    leaves (∓0.8018), each leaf edge its leaf's A."""
    from g2rpo.learner.advantages import plan_advantages

    plan = treegrpo_plan(1, 4, 2, start=0, eval_anchor=False)
    cfg = load_config(
        None,
        [
            "algorithm.name=treegrpo",
            "algorithm.treegrpo.depth=2",
            "sampling.group_size=4",
            "sampling.num_steps=4",
            "sampling.sde_steps=[0]",
        ],
    )
    rewards = torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=F64)
    adv = plan_advantages(plan, {"shapes_clip": rewards}, cfg)
    leaf = (rewards - 3.0) / (3.5**0.5 + 1e-4)
    # slots in the order the tree grows: the root's children, then theirs
    expected = [(leaf[0] + leaf[1]) / 2, (leaf[2] + leaf[3]) / 2, *leaf.tolist()]
    assert adv.tolist() == pytest.approx([float(x) for x in expected])
    assert adv[0] == pytest.approx(-0.80178, abs=1e-4)
    flat = plan_advantages(plan, {"shapes_clip": torch.ones(4, dtype=F64)}, cfg)
    assert torch.equal(flat, torch.zeros_like(flat))  # a group without spread: zero


def test_treegrpo_config_refusals_name_their_fields():
    with pytest.raises(ConfigError, match=r"sampling\.group_size 8: TreeGRPO"):
        load_config(None, ["algorithm.name=treegrpo", "sampling.group_size=8"])
    with pytest.raises(ConfigError, match=r"algorithm\.treegrpo: start 7 \+ depth 4"):
        load_config(
            None,
            [
                "algorithm.name=treegrpo",
                "sampling.group_size=16",
                "sampling.num_steps=10",
                "algorithm.treegrpo.start=7",
            ],
        )
