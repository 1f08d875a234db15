"""Which model evaluations count as training compute: the algorithm's rollout (not a
baseline's logging anchors) plus the learner's forwards; and the NFE budget."""

import torch
from conftest import toy_cond
from g2rpo.common.algorithms.rollout_plan import algorithm_nfe, tree_nfe
from g2rpo.common.algorithms.schedules import sampling_grid
from g2rpo.learner.grpo import StepSpec, grpo_update
from g2rpo.orchestration.budget import Budget
from g2rpo.rollout_worker.engine import RolloutEngine, draw_noise
from g2rpo.rollout_worker.plan import dancegrpo_plan, flowgrpo_plan, g2rpo_plan, mixgrpo_plan


def _run(plan, model, steps):
    init, sde = draw_noise(plan, (4, 3), torch.Generator().manual_seed(0))
    cond = toy_cond(plan.num_prompts)
    return RolloutEngine(model, sampling_grid(steps, 3.0)).run(plan, cond, init, sde), cond


def test_tree_nfe_equals_what_the_engine_evaluates(toy_model):
    T, G, P = 8, 3, 2
    gen = torch.Generator().manual_seed(1)
    for plan in (
        g2rpo_plan(P, T, G, [0, 1, 2], [1, 2]),
        dancegrpo_plan(P, T, G, generator=gen),
        flowgrpo_plan(P, T, G),
        mixgrpo_plan(P, T, G, window=(2, 5)),
    ):
        result, _ = _run(plan, toy_model, T)
        assert tree_nfe(plan) == result.nfe, plan.algorithm


def test_baseline_anchors_are_evaluation_not_training():
    T, G, P = 8, 3, 2
    gen = torch.Generator().manual_seed(1)
    dance = dancegrpo_plan(P, T, G, generator=gen)
    # shared initial noise: v(x0) once, then every member's own T-1 steps
    assert algorithm_nfe(dance) == P * (1 + G * (T - 1))
    # the anchor path shares only v(x0) with the members: T-1 more
    assert tree_nfe(dance) == algorithm_nfe(dance) + P * (T - 1)
    flow = flowgrpo_plan(P, T, G)  # own noise per member: G·T, anchors share member 0's root
    assert algorithm_nfe(flow) == P * G * T
    # shared ODE trunk up to x_2 (3 nodes: x0, x1, x2, whose velocity the SDE step at
    # t=2 uses); the members diverge after it: G·(T−3) nodes each
    mix = mixgrpo_plan(P, T, G, window=(2, 5))
    assert algorithm_nfe(mix) == P * (3 + G * (T - 3))
    g2 = g2rpo_plan(P, T, G, [0, 1], [1])  # the anchor is G²RPO's own trunk
    assert algorithm_nfe(g2) == tree_nfe(g2)


def test_learner_forwards_one_per_distinct_state(toy_model):
    T, G, P = 8, 3, 2
    spec = StepSpec(grid=sampling_grid(T, 3.0), eta=0.7, sde_type="flow")
    for plan, expected in (
        (g2rpo_plan(P, T, G, [0, 1, 2], [1]), P * 3),  # one per (prompt, k)
        (flowgrpo_plan(P, T, G), P * G * (T - 1)),  # every trained step of every member
    ):
        result, cond = _run(plan, toy_model, T)
        adv = torch.randn(int(torch.tensor(plan.adv_shape).prod()), dtype=torch.float64)
        opt = torch.optim.SGD(toy_model.parameters(), lr=0.0)
        stats = grpo_update(
            toy_model,
            list(toy_model.parameters()),
            opt,
            result.transitions,
            adv,
            cond,
            spec,
            clip_range=1e-4,
            max_grad_norm=1.0,
        )
        assert stats.nfe_learn == expected, plan.algorithm


def test_budget_stops_before_an_iteration_would_pass_it():
    b = Budget(limit=1000)
    assert not b.exhausted()  # nothing measured yet: run the first iteration
    for _ in range(3):
        b.add(300)
    assert b.total == 900 and b.exhausted()  # 900 + 300 > 1000
    b = Budget(limit=1200)
    for _ in range(3):
        b.add(300)
    assert not b.exhausted() and b.next_is_last()  # the fourth fits exactly, a fifth not
    b.add(300)
    assert b.exhausted()
    assert not Budget(limit=None, total=10**9, last=10**6).exhausted()
