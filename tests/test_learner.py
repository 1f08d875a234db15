import copy

import pytest
import torch
from conftest import ElementwiseVelocity, flux_cond, toy_cond
from g2rpo.common.algorithms.schedules import sampling_grid
from g2rpo.common.config.loading import load_config
from g2rpo.common.wire.trajectories import Transitions
from g2rpo.learner.advantages import plan_advantages
from g2rpo.learner.grpo import StepSpec, grpo_update, recompute_log_probs
from g2rpo.rollout_worker.engine import RolloutEngine, draw_noise
from g2rpo.rollout_worker.plan import g2rpo_plan

SHAPE = (4, 3)
T = 8


class RecordingSGD(torch.optim.SGD):
    """SGD that remembers the gradient it was handed at every step."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.seen = []

    def step(self, closure=None):
        self.seen.append([p.grad.detach().clone() for p in self.param_groups[0]["params"]])
        return super().step(closure)


def _rollout(model, P=2, G=4, ks=(0, 1, 2), grans=(1, 2), seed=0, shape=SHAPE, cond=None):
    plan = g2rpo_plan(P, T, G, list(ks), list(grans))
    init, sde = draw_noise(plan, shape, torch.Generator().manual_seed(seed))
    cond = toy_cond(P) if cond is None else cond
    with torch.no_grad():
        result = RolloutEngine(model, sampling_grid(T)).run(plan, cond, init, sde)
    return plan, result, cond


def _spec():
    return StepSpec(grid=sampling_grid(T), eta=0.7, sde_type="flow")


def _advantages(plan, result, seed=0):
    g = torch.Generator().manual_seed(seed)
    leaf_r = torch.rand(len(plan.leaves), generator=g)
    cfg = load_config(None, ["rewards=[{name: r}]"])
    return plan_advantages(plan, {"r": leaf_r}, cfg)


def _update(model, opt, result, adv, cond, **kw):
    kw = {"clip_range": 1e-4, "max_grad_norm": 1.0, "step_mode": "accumulate", **kw}
    params = list(model.parameters())
    return grpo_update(model, params, opt, result.transitions, adv, cond, _spec(), **kw)


@pytest.mark.parametrize("mode", ["accumulate", "per_sde_step"])
def test_ratio_is_exactly_one_before_any_update(mode):
    model = ElementwiseVelocity(SHAPE)
    plan, result, cond = _rollout(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if mode == "accumulate":
        stats = _update(model, opt, result, _advantages(plan, result), cond, step_mode=mode)
        assert stats.ratio_min == stats.ratio_max == 1.0
        assert stats.clip_fraction == 0.0 and stats.optimizer_steps == 1
    else:
        rows = torch.nonzero(result.transitions.state_step[result.transitions.state_index] == 0)
        lp, _, _ = recompute_log_probs(model, result.transitions, rows.flatten(), cond, _spec())
        assert torch.equal(
            torch.exp(lp - result.transitions.old_log_probs[rows.flatten()]), torch.ones(len(rows))
        )


def test_ratio_near_one_on_flux_transformer(tiny_flux):
    cond = flux_cond(2)
    _, result, _ = _rollout(tiny_flux, shape=(4, 64), cond=cond)
    tr = result.transitions
    lp, _, _ = recompute_log_probs(tiny_flux, tr, torch.arange(len(tr)), cond, _spec())
    ratio = torch.exp(lp - tr.old_log_probs)
    assert (ratio - 1).abs().max() < 1e-5  # batch composition differs from the rollout's


def test_optimizer_steps_and_accumulated_gradient_is_mean_of_per_step():
    model = ElementwiseVelocity(SHAPE)
    plan, result, cond = _rollout(model, ks=(0, 2, 5))
    adv = _advantages(plan, result)
    per = RecordingSGD(model.parameters(), lr=0.0)
    s1 = _update(model, per, result, adv, cond, max_grad_norm=1e9, step_mode="per_sde_step")
    acc = RecordingSGD(model.parameters(), lr=0.0)
    s2 = _update(model, acc, result, adv, cond, max_grad_norm=1e9)
    assert s1.optimizer_steps == len(per.seen) == 3
    assert s2.optimizer_steps == len(acc.seen) == 1
    for i in range(3):
        mean_k = torch.stack([step[i] for step in per.seen]).mean(0)
        assert torch.allclose(acc.seen[0][i], mean_k, atol=1e-7)
    assert s1.loss == pytest.approx(s2.loss, abs=1e-7)  # both −mean(A) ≈ 0 at ratio 1


def test_per_samples_mode_steps_every_n_samples_with_equal_weights():
    from g2rpo.rollout_worker.plan import dancegrpo_plan

    model = ElementwiseVelocity(SHAPE)
    plan = dancegrpo_plan(
        1, T, 6, generator=torch.Generator().manual_seed(0), timestep_fraction=0.5
    )
    init, sde = draw_noise(plan, SHAPE, torch.Generator().manual_seed(0))
    cond = toy_cond(1)
    with torch.no_grad():
        result = RolloutEngine(model, sampling_grid(T)).run(plan, cond, init, sde)
    adv = _advantages(plan, result)
    per = RecordingSGD(model.parameters(), lr=0.0)
    stats = _update(
        model,
        per,
        result,
        adv,
        cond,
        max_grad_norm=1e9,
        step_mode="per_samples",
        samples_per_step=4,
    )
    assert stats.optimizer_steps == len(per.seen) == 2  # 6 samples in blocks of 4
    acc = RecordingSGD(model.parameters(), lr=0.0)
    _update(model, acc, result, adv, cond, max_grad_norm=1e9)
    # every (sample, step) weighs the same: the block gradients, weighted by their
    # transition counts, add up to the single accumulated gradient
    counts = [4 * 3, 2 * 3]  # ⌊7·0.5⌋ = 3 trained steps per sample
    assert len(result.transitions) == 18
    for i in range(3):
        blocks = sum(c * step[i] for c, step in zip(counts, per.seen, strict=True)) / 18
        assert torch.allclose(acc.seen[0][i], blocks, atol=1e-7)


def test_shared_forward_equals_separate_forwards():
    model = ElementwiseVelocity(SHAPE)
    _, result, cond = _rollout(model)
    tr = result.transitions
    # the same transitions with every state duplicated (no sharing of the forward)
    sep = Transitions(
        states=tr.states[tr.state_index],
        state_step=tr.state_step[tr.state_index],
        state_prompt=tr.state_prompt[tr.state_index],
        next_samples=tr.next_samples,
        next_step=tr.next_step,
        old_log_probs=tr.old_log_probs,
        state_index=torch.arange(len(tr)),
        adv_slot=tr.adv_slot,
    )
    assert tr.states.shape[0] < sep.states.shape[0]
    rows = torch.arange(len(tr))
    grads = []
    for t in (tr, sep):
        model.zero_grad()
        lp, _, _ = recompute_log_probs(model, t, rows, cond, _spec())
        (lp * torch.linspace(-1, 1, len(tr))).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        grads.append(lp.detach())
    assert torch.equal(grads[1], grads[3])
    for a, b in zip(grads[0], grads[2], strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_grad_norm_is_clipped_and_reported():
    model = ElementwiseVelocity(SHAPE)
    plan, result, cond = _rollout(model)
    opt = RecordingSGD(model.parameters(), lr=0.0)
    stats = _update(model, opt, result, _advantages(plan, result), cond, max_grad_norm=1e-6)
    assert stats.grad_norm > 1e-6
    clipped = torch.sqrt(sum((g**2).sum() for g in opt.seen[0]))
    assert clipped == pytest.approx(1e-6, rel=1e-3)


def test_kl_to_reference_is_zero_for_the_same_model_and_positive_after_a_step():
    model = ElementwiseVelocity(SHAPE)
    reference = copy.deepcopy(model).requires_grad_(False)
    plan, result, cond = _rollout(model)
    adv = _advantages(plan, result)
    kw = dict(step_mode="per_sde_step", reference_model=reference, kl_beta=0.04)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    first = _update(model, opt, result, adv, cond, **kw)
    assert first.kl > 0  # the steps after the first see an updated policy
    model2 = copy.deepcopy(reference).requires_grad_(True)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.0)
    zero = _update(model2, opt2, result, adv, cond, **kw)
    assert zero.kl == 0.0
    # every recomputed state is also run through the reference, without a backward
    states = int(torch.unique(result.transitions.state_index).numel())
    assert zero.nfe_learn == 2 * states and zero.nfe_learn_no_grad == states
    plain = _update(model2, opt2, result, adv, cond, step_mode="per_sde_step")
    assert plain.nfe_learn == states and plain.nfe_learn_no_grad == 0
    with pytest.raises(ValueError, match="reference_model"):
        _update(model2, opt2, result, adv, cond, kl_beta=0.1)


def _anchor_reward(model, cond, target, init):
    plan = g2rpo_plan(cond["text"].shape[0], T, 2, [0], [1])
    sde = torch.zeros(plan.num_noises, *SHAPE)
    with torch.no_grad():
        res = RolloutEngine(model, sampling_grid(T)).run(plan, cond, init, sde)
    return -((res.anchor_latents() - target) ** 2).mean().item()


def test_g2rpo_raises_the_anchor_reward_of_a_toy_model():
    """Learning signal: reward = −‖x̂0 − target‖²; a few iterations must raise the ODE
    sample's reward, and the same run with shuffled advantages must not."""
    target = torch.full(SHAPE, 0.5)
    init = torch.randn(2, *SHAPE, generator=torch.Generator().manual_seed(7))

    def train(control: bool) -> tuple[float, float]:
        model = ElementwiseVelocity(SHAPE, seed=3)
        cond = toy_cond(2)
        cfg = load_config(None, ["rewards=[{name: mse}]", f"algorithm.control={control}"])
        opt = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.0)
        before = _anchor_reward(model, cond, target, init)
        shuffle = torch.Generator().manual_seed(0)
        for it in range(15):
            plan = g2rpo_plan(2, T, 8, [0, 1, 2, 3], [1, 2])
            i0, sde = draw_noise(plan, SHAPE, torch.Generator().manual_seed(100 + it))
            with torch.no_grad():
                res = RolloutEngine(model, sampling_grid(T)).run(plan, cond, init, sde)
            r = -((res.leaf_latents - target) ** 2).flatten(1).mean(1)
            adv = plan_advantages(plan, {"mse": r}, cfg, shuffle)
            _update(model, opt, res, adv, cond)
            del i0
        return before, _anchor_reward(model, cond, target, init)

    before, after = train(control=False)
    c_before, c_after = train(control=True)
    assert after > before + 0.5 * abs(before)
    assert (c_after - c_before) < 0.5 * (after - before)


def test_a_sharded_checkpoint_resumes_a_parameter_that_never_had_a_gradient(tmp_path):
    """AdamW makes a parameter's state at its first gradient. A FLUX transformer whose
    last block is a double-stream one never uses that block's text output, so those
    weights never get state; the sharded checkpoint then lacks it, and loading it into a
    fresh optimizer (which DCP gives state for every parameter) failed with "Missing key
    in checkpoint state_dict" (found by `g2rpo rehearse` on its one-block model). The
    resumed optimizer holds exactly the saved state, and the next step is the same."""
    from g2rpo.common.families.flux import build_tiny_flux
    from g2rpo.learner.checkpoints import load_sharded, save_sharded

    def step(model, optimizer, names):
        for n, p in model.named_parameters():  # only these get a gradient
            p.grad = torch.ones_like(p) if n in names else None
        optimizer.step()

    model = build_tiny_flux("test", seed=0)
    used = {n for n, _ in model.named_parameters()} - {
        n for n, _ in model.named_parameters() if "to_add_out" in n
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step(model, optimizer, used)
    save_sharded(model, optimizer, tmp_path / "it_00001.dcp", {"version": 1, "iteration": 1})

    fresh = build_tiny_flux("test", seed=1)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    assert load_sharded(fresh, fresh_opt, tmp_path / "it_00001.dcp")["iteration"] == 1
    params = dict(fresh.named_parameters())
    held = {n for n, p in params.items() if p in fresh_opt.state}
    assert held == used
    step(model, optimizer, used)
    step(fresh, fresh_opt, used)
    for (n, a), b in zip(model.named_parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b), n
