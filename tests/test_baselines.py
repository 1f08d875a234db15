"""Each baseline's stochastic and trained steps, as its paper/code states them."""

import torch
from conftest import ElementwiseVelocity, toy_cond
from g2rpo.common.algorithms.schedules import sampling_grid
from g2rpo.common.config.loading import load_config
from g2rpo.rollout_worker.engine import RolloutEngine, draw_noise
from g2rpo.rollout_worker.plan import dancegrpo_plan, flowgrpo_plan, mixgrpo_plan, plan_for
from g2rpo.rollout_worker.step_windows import mixgrpo_window

SHAPE = (4, 3)


def _steps(leaf, what):
    prev = 0
    out = []
    for e in leaf.edges:
        if (what == "sde" and e.stochastic) or (what == "trained" and e.trained):
            out.append(prev)
        prev = e.to
    return out


def _run(plan, seed=0):
    model = ElementwiseVelocity(SHAPE)
    init, sde = draw_noise(plan, SHAPE, torch.Generator().manual_seed(seed))
    engine = RolloutEngine(model, sampling_grid(plan.num_steps))
    b = engine.run(plan, toy_cond(plan.num_prompts), init, sde, "batched")
    r = engine.run(plan, toy_cond(plan.num_prompts), init, sde, "reference")
    return b, r


def test_dancegrpo_sde_everywhere_random_sixty_percent_trained():
    plan = dancegrpo_plan(2, 16, 12, generator=torch.Generator().manual_seed(0))
    assert plan.sde_type == "dance" and plan.eta == 0.3
    samples = [leaf for leaf in plan.leaves if leaf.kind == "sample"]
    assert len(samples) == 24 and len({leaf.root for leaf in samples}) == 2  # same noise
    subsets = set()
    for leaf in samples:
        assert _steps(leaf, "sde") == list(range(16))
        trained = _steps(leaf, "trained")
        assert len(trained) == 9 and 15 not in trained  # ⌊15·0.6⌋, never the last step
        subsets.add(tuple(trained))
    assert len(subsets) > 12  # a different random subset per member
    b, r = _run(plan)
    assert len(b.transitions) == 24 * 9
    # shared noise: v(x0) is computed once per prompt (members and eval anchor share
    # it), then 15 evaluations per member and per anchor; the official loop pays 16 each
    assert b.nfe == 2 * (1 + 12 * 15 + 15)
    assert r.nfe == 2 * 13 * 16
    assert torch.equal(b.leaf_latents, r.leaf_latents)
    assert torch.equal(b.transitions.old_log_probs, r.transitions.old_log_probs)


def test_flowgrpo_all_sde_all_but_last_trained_own_noise():
    plan = flowgrpo_plan(1, 16, 6)
    samples = [leaf for leaf in plan.leaves if leaf.kind == "sample"]
    assert len({leaf.root for leaf in samples}) == 6  # independent initial noise
    for leaf in samples:
        assert _steps(leaf, "sde") == list(range(16))
        assert _steps(leaf, "trained") == list(range(15))  # int(16·0.99) = 15
    same = flowgrpo_plan(1, 10, 4, init_same_noise=True, train_fraction=0.5)
    assert len({leaf.root for leaf in same.leaves}) == 1
    assert _steps(same.leaves[0], "trained") == [0, 1, 2, 3, 4]
    b, r = _run(plan)
    assert torch.equal(b.leaf_latents, r.leaf_latents)


def test_mixgrpo_window_progression():
    # T=25, W=4, 25 iterations per position: steps range(s, min(s+W, T-2))
    assert mixgrpo_window(0, 25, 4, 25, 1, True) == (0, 4)
    assert mixgrpo_window(24, 25, 4, 25, 1, True) == (0, 4)
    assert mixgrpo_window(25, 25, 4, 25, 1, True) == (1, 5)
    assert mixgrpo_window(299, 25, 4, 25, 1, True) == (11, 15)  # 300 iterations sweep 0 → 11
    assert mixgrpo_window(20 * 25, 25, 4, 25, 1, True) == (20, 23)  # last stochastic step 22
    assert mixgrpo_window(22 * 25, 25, 4, 25, 1, True) == (22, 23)
    assert mixgrpo_window(23 * 25, 25, 4, 25, 1, True) == (0, 4)  # rolled back
    assert mixgrpo_window(23 * 25, 25, 4, 25, 1, False) == (22, 23)  # frozen at T-3
    assert mixgrpo_window(500, 25, 4, 25, 0, True) == (0, 4)  # stride 0: frozen window
    # stride 5 restarts at 0, not at 25 mod 23
    assert [mixgrpo_window(i * 25, 25, 4, 25, 5, True)[0] for i in range(7)] == [
        0,
        5,
        10,
        15,
        20,
        0,
        5,
    ]


def test_mixgrpo_sde_and_training_only_inside_window_with_shared_trunk():
    T, G, window = 12, 5, (3, 7)
    plan = mixgrpo_plan(1, T, G, window=window)
    for leaf in plan.leaves:
        if leaf.kind == "sample":
            assert _steps(leaf, "sde") == [3, 4, 5, 6]
            assert _steps(leaf, "trained") == [3, 4, 5, 6]
        else:
            assert _steps(leaf, "sde") == []
    b, r = _run(plan)
    # ODE trunk 0..3 shared by all members and the anchor: 3 evaluations, then the
    # window node (x3) once, then each member's own path (T-4 evaluations), anchor T-3.
    assert b.nfe == 3 + 1 + G * (T - 4) + (T - 4)
    assert r.nfe == (G + 1) * T
    assert torch.equal(b.leaf_latents, r.leaf_latents)
    assert len(b.transitions) == G * 4


def test_plan_for_reads_the_config():
    cfg = load_config(
        None, ["algorithm.name=mixgrpo", "sampling.num_steps=25", "sampling.sde_steps=[0]"]
    )
    plan = plan_for(cfg, 60, torch.Generator())  # ⌊60/25⌋ = 2
    sample = next(leaf for leaf in plan.leaves if leaf.kind == "sample")
    assert _steps(sample, "sde") == [2, 3, 4, 5]
    cfg = load_config(None, ["algorithm.name=dancegrpo", "sampling.eta=0.3"])
    assert plan_for(cfg, 0, torch.Generator().manual_seed(0)).sde_type == "dance"


def test_baseline_advantage_aggregation():
    from g2rpo.common.algorithms.advantages import group_normalize
    from g2rpo.learner.advantages import plan_advantages

    g = torch.Generator().manual_seed(0)
    rewards = ["a", "b"]
    overrides = ["rewards=[{name: a, weight: 2.0}, {name: b, weight: 1.0}]", "optim.adv_clip=100"]

    def adv(algorithm, plan):
        cfg = load_config(None, [*overrides, f"algorithm.name={algorithm}"])
        leaf = {n: torch.rand(len(plan.leaves), generator=g) for n in rewards}
        grids = {n: plan.gather(r, "sample").double() for n, r in leaf.items()}
        return plan_advantages(plan, leaf, cfg).reshape(plan.adv_shape), grids

    # MixGRPO: per-reward advantages with weights normalised to sum to 1
    mix, grids = adv("mixgrpo", mixgrpo_plan(2, 8, 5, window=(0, 2)))
    expect = (2 * group_normalize(grids["a"]) + group_normalize(grids["b"])) / 3
    assert torch.allclose(mix, expect)
    # Flow-GRPO: weighted reward sum first, then population std + 1e-4
    flow, grids = adv("flowgrpo", flowgrpo_plan(2, 8, 5))
    total = 2 * grids["a"] + grids["b"]
    centred = total - total.mean(-1, keepdim=True)
    assert torch.allclose(flow, centred / (total.std(-1, unbiased=False, keepdim=True) + 1e-4))
    # DanceGRPO: per-reward, unbiased std, weights as given
    dance, grids = adv("dancegrpo", dancegrpo_plan(2, 8, 5, generator=g))
    assert torch.allclose(dance, 2 * group_normalize(grids["a"]) + group_normalize(grids["b"]))
