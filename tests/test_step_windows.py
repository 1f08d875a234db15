"""G²RPO's cheaper schedules (algorithm.g2rpo): which of sampling.sde_steps branch in an
iteration, and what the plan and its NFEs become."""

import pytest
import torch
from g2rpo.common.algorithms.rollout_plan import algorithm_nfe
from g2rpo.common.config.loading import load_config
from g2rpo.common.errors import ConfigError
from g2rpo.rollout_worker.plan import plan_for
from g2rpo.rollout_worker.step_windows import g2rpo_branch_steps

STEPS = [0, 1, 2, 3]


def test_all_steps_unless_a_subset_is_asked():
    assert g2rpo_branch_steps(STEPS, 7, 0, None) == STEPS
    assert g2rpo_branch_steps(STEPS, 7, 0, 4) == STEPS
    assert g2rpo_branch_steps(STEPS, 7, 0, 9) == STEPS


def test_sliding_window_moves_one_entry_every_slide_every_and_starts_over():
    windows = [g2rpo_branch_steps(STEPS, it, 0, 2, "sliding", 10) for it in range(0, 50, 5)]
    assert windows == [
        [0, 1], [0, 1], [1, 2], [1, 2], [2, 3], [2, 3], [0, 1], [0, 1], [1, 2], [1, 2],
    ]  # fmt: skip
    # the entries of sde_steps, not positions on the grid
    assert g2rpo_branch_steps([0, 2, 4, 6], 25, 0, 3, "sliding", 25) == [2, 4, 6]


def test_sampled_steps_are_one_draw_per_iteration_the_same_for_every_caller():
    draws = [g2rpo_branch_steps(STEPS, it, 5, 2, "sampled") for it in range(400)]
    assert all(len(d) == 2 and d == sorted(set(d)) and set(d) <= set(STEPS) for d in draws)
    assert draws == [g2rpo_branch_steps(STEPS, it, 5, 2, "sampled") for it in range(400)]
    assert draws != [g2rpo_branch_steps(STEPS, it, 6, 2, "sampled") for it in range(400)]
    # uniform without replacement: each of the 6 pairs about 1/6 of the time, each step 1/2
    pairs = {tuple(d) for d in draws}
    assert len(pairs) == 6
    for k in STEPS:
        share = sum(k in d for d in draws) / len(draws)
        assert 0.42 < share < 0.58, (k, share)


def _cfg(*extra):
    return load_config(None, ["sampling.num_steps=16", "sampling.sde_steps=[0,1,2,3]", *extra])


def test_the_plan_branches_at_the_drawn_steps_only_and_costs_less():
    full = plan_for(_cfg(), 3, torch.Generator().manual_seed(0))
    cfg = _cfg("algorithm.g2rpo.steps_per_iteration=1", "run.seed=11")
    one = plan_for(cfg, 3, torch.Generator().manual_seed(0))
    # the worker's own generator does not decide the step: every worker branches alike
    assert one.sde_steps == plan_for(cfg, 3, torch.Generator().manual_seed(99)).sde_steps
    assert one.sde_steps == g2rpo_branch_steps([0, 1, 2, 3], 3, 11, 1)
    P, G = cfg.sampling.prompts_per_worker, cfg.sampling.group_size
    assert one.adv_shape == (P, 1, G) and full.adv_shape == (P, 4, G)
    (k,) = one.sde_steps
    trained = {e.to - 1 for leaf in one.leaves for e in leaf.edges if e.trained}
    assert trained == {k}
    # the anchor is shared; each branch costs its SDE step plus its completions
    assert algorithm_nfe(one) < algorithm_nfe(full)


def test_a_subset_larger_than_the_steps_on_another_method_or_without_a_size_is_refused():
    with pytest.raises(ConfigError, match=r"algorithm.g2rpo.steps_per_iteration 5 exceeds"):
        _cfg("algorithm.g2rpo.steps_per_iteration=5")
    with pytest.raises(ConfigError, match=r"steps_per_iteration: G²RPO's schedule, but"):
        _cfg("algorithm.g2rpo.steps_per_iteration=2", "algorithm.name=dancegrpo")
    with pytest.raises(ConfigError, match=r"slide_every: G²RPO's schedule, but .* dancegrpo"):
        _cfg("algorithm.g2rpo.slide_every=5", "algorithm.name=dancegrpo")
    # a choice without a subset would be silently ignored
    with pytest.raises(ConfigError, match=r"set algorithm.g2rpo.steps_per_iteration too"):
        _cfg("algorithm.g2rpo.step_choice=sliding")
