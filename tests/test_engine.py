import itertools

import pytest
import torch
from conftest import ElementwiseVelocity, flux_cond, toy_cond
from g2rpo.common.algorithms.schedules import completion_indices, expected_g2rpo_nfe, sampling_grid
from g2rpo.common.algorithms.sde import sde_step
from g2rpo.rollout_worker.engine import RolloutEngine, draw_noise
from g2rpo.rollout_worker.plan import g2rpo_plan

SHAPE = (4, 3)


def _run(model, plan, cond, execution="batched", max_batch=256, seed=0, shape=SHAPE):
    T = plan.num_steps
    init, sde = draw_noise(plan, shape, torch.Generator().manual_seed(seed))
    engine = RolloutEngine(model, sampling_grid(T, 3.0), max_batch=max_batch)
    return engine.run(plan, cond, init, sde, execution), init, sde


@pytest.mark.parametrize(("grans", "expect"), [([1, 2], 1552), ([1, 2, 3], 1828)])
def test_nfe_counts_match_the_distinct_node_formula(grans, expect):
    model = ElementwiseVelocity(SHAPE)
    plan = g2rpo_plan(1, 16, 12, list(range(8)), grans)
    result, _, _ = _run(model, plan, toy_cond(1))
    assert result.nfe == expect == model.nfe
    assert result.model_calls == 16 == model.calls  # one call per tick


def test_reference_mode_counts_the_official_loop():
    # official code: 16 anchor + 96 SDE-step forwards + 12·(92+48) completions = 1792
    model = ElementwiseVelocity(SHAPE)
    plan = g2rpo_plan(1, 16, 12, list(range(8)), [1, 2], terminal="reference")
    result, _, _ = _run(model, plan, toy_cond(1), "reference")
    assert result.nfe == result.model_calls == 1792
    batched, _, _ = _run(model, plan, toy_cond(1))
    assert batched.nfe == expected_g2rpo_nfe(16, 12, list(range(8)), [1, 2], "reference")


@pytest.mark.parametrize("terminal", ["exact", "reference"])
def test_batched_equals_reference_bitwise_on_a_batch_invariant_model(terminal):
    model = ElementwiseVelocity(SHAPE)
    plan = g2rpo_plan(2, 10, 5, [0, 1, 3, 8], [1, 2, 3], terminal=terminal)
    cond = toy_cond(2)
    b, _, _ = _run(model, plan, cond, "batched", max_batch=7)
    r, _, _ = _run(model, plan, cond, "reference")
    assert torch.equal(b.leaf_latents, r.leaf_latents)
    tb, tr = b.transitions, r.transitions
    assert torch.equal(tb.old_log_probs, tr.old_log_probs)
    assert torch.equal(tb.next_samples, tr.next_samples)
    assert torch.equal(tb.states, tr.states)
    assert torch.equal(tb.adv_slot, tr.adv_slot)
    assert b.model_calls > 10  # chunking by max_batch=7 splits ticks


def test_batched_matches_reference_on_flux_transformer(tiny_flux):
    plan = g2rpo_plan(2, 8, 4, [0, 1, 2, 3], [1, 2], terminal="exact")
    cond = flux_cond(2)
    b, _, _ = _run(tiny_flux, plan, cond, "batched", shape=(4, 64))
    r, _, _ = _run(tiny_flux, plan, cond, "reference", shape=(4, 64))
    assert (b.leaf_latents - r.leaf_latents).abs().max() <= 1e-4
    assert (b.transitions.old_log_probs - r.transitions.old_log_probs).abs().max() <= 1e-4
    assert b.nfe == expected_g2rpo_nfe(8, 4, [0, 1, 2, 3], [1, 2], "exact", 2)


def _euler_path(model, x, cond_row, indices, grid):
    """Independent sequential integration along grid indices (one sample)."""
    sigmas = grid.sigmas
    for a, b in itertools.pairwise(indices):
        t = grid.timesteps[a].reshape(1)
        v = model(x[None], t, {k: c[None] for k, c in cond_row.items()})[0]
        x = x + (sigmas[b] - sigmas[a]).float() * v
    return x


def test_anchor_and_branches_follow_their_schedules():
    T, G, ks, grans = 12, 3, [0, 3, 7], [1, 2, 3]
    model = ElementwiseVelocity(SHAPE)
    grid = sampling_grid(T, 3.0)
    sig = grid.sigmas
    plan = g2rpo_plan(1, T, G, ks, grans, terminal="reference")
    cond = toy_cond(1)
    result, init, sde = _run(model, plan, cond)
    c0 = {k: c[0] for k, c in cond.items()}
    anchor = [init[0]]
    for i in range(T):
        anchor.append(_euler_path(model, anchor[-1], c0, [i, i + 1], grid))
    assert torch.equal(result.anchor_latents()[0], anchor[-1])
    # every group shares the anchor state x_k (one forward per (prompt, k) in the learner)
    tr = result.transitions
    assert tr.states.shape[0] == len(ks) and len(tr) == len(ks) * G
    for row, k in enumerate(ks):
        assert torch.equal(tr.states[row], anchor[k])
        assert tr.state_step[row] == k
    branches = plan.gather(result.leaf_latents, "branch")
    for ki, k in enumerate(ks):
        for j in range(G):
            slot = ki * G + j
            ti = int(torch.nonzero(tr.adv_slot == slot))
            t = grid.timesteps[k].reshape(1)
            v = model(anchor[k][None], t, cond)[0]
            step = sde_step(
                anchor[k][None],
                v[None],
                sig[k],
                sig[k + 1],
                0.7,
                sigma_1=float(sig[1]),
                noise=sde[slot][None],
            )
            assert torch.equal(tr.next_samples[ti], step.sample[0])
            assert torch.equal(tr.old_log_probs[ti], step.log_prob[0])
            for gi, g in enumerate(grans):
                nodes = completion_indices(k, g, T, "reference")
                expect = _euler_path(model, step.sample[0], c0, nodes, grid)
                assert torch.allclose(branches[0, ki, gi, j], expect, atol=1e-6)


def test_reference_terminal_returns_x0_prediction_of_last_evaluated_node():
    T = 16
    model = ElementwiseVelocity(SHAPE)
    plan = g2rpo_plan(1, T, 2, [1], [2], terminal="reference")
    result, _, _ = _run(model, plan, toy_cond(1))
    ex_plan = g2rpo_plan(1, T, 2, [1], [2], terminal="exact")
    exact, _, _ = _run(model, ex_plan, toy_cond(1))
    # grids end ...13 -> 16 (reference: x0 from σ13) vs ...13 -> 15 -> 16 (exact)
    ref_b = plan.gather(result.leaf_latents, "branch")
    ex_b = ex_plan.gather(exact.leaf_latents, "branch")
    assert not torch.allclose(ref_b, ex_b)
    assert exact.nfe == result.nfe + 2  # one more evaluation (σ15) per member
    # the reference leaf equals x13 − σ13·v(x13) computed by hand from the exact run's path
    assert completion_indices(1, 2, T, "reference")[-2:] == [13, 16]


def test_noise_tables_are_required_to_fit():
    model = ElementwiseVelocity(SHAPE)
    plan = g2rpo_plan(1, 6, 2, [0], [1])
    engine = RolloutEngine(model, sampling_grid(6))
    init, sde = draw_noise(plan, SHAPE, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="init_noise"):
        engine.run(plan, toy_cond(1), init[:0], sde)
    with pytest.raises(ValueError, match="sde_noise"):
        engine.run(plan, toy_cond(1), init, sde[:1])
    with pytest.raises(ValueError, match="prompts"):
        engine.run(plan, toy_cond(2), init, sde)
    with pytest.raises(ValueError, match="execution"):
        engine.run(plan, toy_cond(1), init, sde, "fast")
