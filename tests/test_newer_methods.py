"""The newer methods in the same engine (../shared/docs/newer-methods.md): CPS's step
(coefficients, noise, log-prob), TempFlow-GRPO's tree, noise-aware step weights and
per-(prompt, step) advantages, Flow-GRPO-Fast's trunk-and-window plan, GRPO-Guard's
normalised ratio and per-step reweighting, each method's NFEs as the doc's table derives
them (2 iterations of each through the Ray path: tests/test_newer_methods_training.py).
BranchGRPO: tests/test_newer_methods_branchgrpo.py; DiffusionNFT and AWM:
tests/test_newer_methods_nft.py."""

from __future__ import annotations

import math

import pytest
import torch
from g2rpo.common.algorithms.ppo import ppo_clip_loss
from g2rpo.common.algorithms.rollout_plan import algorithm_nfe, tree_nfe
from g2rpo.common.algorithms.sde import cps_coefficients, noise_step_weights, sde_step
from g2rpo.common.config.loading import load_config
from g2rpo.common.errors import ConfigError
from g2rpo.rollout_worker.plan import flowgrpo_fast_plan, plan_for, tempflow_plan

F64 = torch.float64


def _sd3_sigmas(num_steps: int, shift: float = 3.0) -> torch.Tensor:
    """SD3's scheduler grid (diffusers FlowMatchEulerDiscreteScheduler.set_timesteps):
    linspace(1, σ_min, T) shifted, σ_min = the shifted 1/1000, then 0."""

    def shifted(s):
        return shift * s / (1 + (shift - 1) * s)

    low = shifted(torch.tensor(1e-3, dtype=F64))
    grid = shifted(torch.linspace(1.0, float(low), num_steps, dtype=F64))
    return torch.cat([grid, torch.zeros(1, dtype=F64)])


# ------------------------------------------------------------------------------ CPS


def test_cps_at_eta_zero_is_the_euler_step():
    sigma, nxt = torch.tensor([0.9, 0.4], dtype=F64), torch.tensor([0.7, 0.1], dtype=F64)
    c = cps_coefficients(sigma, nxt, 0.0)
    torch.testing.assert_close(c.cx, torch.ones(2, dtype=F64))
    torch.testing.assert_close(c.cv, nxt - sigma)
    assert torch.all(c.std == 0)


def test_cps_preserves_the_flow_paths_coefficients():
    """With x = (1−σ)x0 + σε and the exact velocity v = ε − x0, the CPS mean holds x0 with
    coefficient 1−σ' and old noise with σ'·cos(ηπ/2); fresh noise τ = σ'·sin(ηπ/2)
    brings the noise variance back to σ'² (arXiv 2509.05952)."""
    sigma = torch.tensor([1.0, 0.8, 0.35], dtype=F64)
    nxt = torch.tensor([0.9, 0.5, 0.05], dtype=F64)
    eta = 0.8
    c = cps_coefficients(sigma, nxt, eta)
    # μ = cx·x + cv·v: x0 enters x with (1−σ) and v with −1; ε with σ and +1
    torch.testing.assert_close(c.cx * (1 - sigma) - c.cv, 1 - nxt)
    torch.testing.assert_close(c.cx * sigma + c.cv, nxt * math.cos(eta * math.pi / 2))
    torch.testing.assert_close(c.std, nxt * math.sin(eta * math.pi / 2))
    torch.testing.assert_close(
        (c.cx * sigma + c.cv) ** 2 + c.std**2, nxt**2
    )  # the noise variance stays σ'²
    # and by sampling: x' has mean (1−σ')x0 and variance σ'² around it
    gen = torch.Generator().manual_seed(0)
    x0 = torch.full((200_000, 1), 0.3, dtype=F64)
    eps = torch.randn(x0.shape, generator=gen, dtype=F64)
    fresh = torch.randn(x0.shape, generator=gen, dtype=F64)
    x = (1 - 0.8) * x0 + 0.8 * eps
    out = sde_step(x, eps - x0, 0.8, 0.5, eta, sde_type="cps", noise=fresh)
    assert abs(float(out.sample.mean()) - 0.5 * 0.3) < 0.005
    assert abs(float(out.sample.var()) - 0.5**2) < 0.005


def test_cps_log_prob_is_the_gaussian_of_its_step_and_its_last_step_is_deterministic():
    gen = torch.Generator().manual_seed(1)
    x, v = torch.randn(3, 8, generator=gen), torch.randn(3, 8, generator=gen)
    noise = torch.randn(3, 8, generator=gen)
    out = sde_step(x, v, 0.6, 0.3, 0.7, sde_type="cps", noise=noise)
    tau = 0.3 * math.sin(0.7 * math.pi / 2)
    expected = torch.distributions.Normal(out.mean.double(), tau).log_prob(out.sample.double())
    torch.testing.assert_close(out.log_prob.double(), expected.mean(dim=1), rtol=0, atol=1e-6)
    last = sde_step(x, v, 0.2, 0.0, 0.7, sde_type="cps", noise=noise)
    assert last.log_prob is None and torch.equal(last.sample, last.mean)


def test_cps_is_a_sampler_option_with_its_eta_checked():
    cfg = load_config(None, ["sampling.sde_type=cps", "sampling.eta=0.8"])
    plan = plan_for(cfg, 0, torch.Generator().manual_seed(0))
    assert cfg.sde_type() == "cps" and plan.sde_type == "cps"
    assert load_config(None, ["algorithm.name=dancegrpo"]).sde_type() == "dance"
    with pytest.raises(ConfigError, match=r"sampling\.eta 1\.2 with sampling\.sde_type cps"):
        load_config(None, ["sampling.sde_type=cps", "sampling.eta=1.2"])


def test_cps_flow_grpo_ratio_is_the_gaussian_ratio_to_the_power_two_tau_squared():
    """optim.cps_ratio flow_grpo: flow_grpo's CPS log-prob is −mean((x'−μ)²) (no variance,
    no constant), so its log-ratio is 2τ² times the Gaussian one (newer-methods.md §6d);
    checked against that definition on one step's tensors."""
    from g2rpo.common.algorithms.schedules import sampling_grid
    from g2rpo.common.wire.trajectories import Transitions
    from g2rpo.learner.grpo import StepSpec, policy_log_ratio

    grid = sampling_grid(6, 3.0)
    gen = torch.Generator().manual_seed(4)
    x_next = torch.randn(3, 5, generator=gen)
    mean_old, mean_new = torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen)
    steps = torch.tensor([0, 2, 4])
    tau = cps_coefficients(grid.sigmas[steps], grid.sigmas[steps + 1], 0.8).std
    from g2rpo.common.algorithms.sde import gaussian_log_prob

    lp_old = gaussian_log_prob(x_next, mean_old, tau)
    lp_new = gaussian_log_prob(x_next, mean_new, tau)
    tr = Transitions(
        states=torch.zeros(3, 5),
        state_step=steps,
        state_prompt=torch.zeros(3, dtype=torch.long),
        next_samples=x_next,
        next_step=steps + 1,
        old_log_probs=lp_old,
        state_index=torch.arange(3),
        adv_slot=torch.arange(3),
    )
    rows = torch.arange(3)
    spec = StepSpec(grid=grid, eta=0.8, sde_type="cps", cps_flow_grpo=True)
    log_ratio, weights = policy_log_ratio(spec, tr, rows, lp_new, mean_new)
    official = -((x_next - mean_new) ** 2).mean(1) + ((x_next - mean_old) ** 2).mean(1)
    torch.testing.assert_close(log_ratio, official, rtol=1e-4, atol=1e-6)
    assert weights is None
    plain, _ = policy_log_ratio(
        StepSpec(grid=grid, eta=0.8, sde_type="cps"), tr, rows, lp_new, mean_new
    )
    torch.testing.assert_close(plain, lp_new - lp_old)
    with pytest.raises(ConfigError, match=r"optim\.cps_ratio flow_grpo .* sampling\.sde_type cps"):
        load_config(None, ["optim.cps_ratio=flow_grpo"])


# ------------------------------------------------------------------------ TempFlow


def test_noise_aware_weights_reproduce_the_official_constants():
    """TempFlow's code multiplies each step's PPO terms by 2.25·τ (SD3.5-M, T=10); that is
    τ over the mean τ of the 9 trained steps on SD3's grid (newer-methods.md §3d: 2.252,
    and 2.886 at T=16). The weights are mean 1 over the trained steps, 1 elsewhere."""
    for steps, constant in ((10, 2.252), (16, 2.886)):
        sigmas = _sd3_sigmas(steps)
        trained = list(range(steps - 1))
        w = noise_step_weights(sigmas, trained, 0.7, "flow", float(sigmas[1]))
        tau0 = sde_step(
            torch.zeros(1, 1),
            torch.zeros(1, 1),
            sigmas[0],
            sigmas[1],
            0.7,
            sde_type="flow",
            sigma_1=float(sigmas[1]),
            noise=torch.zeros(1, 1),
        ).std
        assert float(tau0 / w[0]) == pytest.approx(1 / constant, rel=2e-3)
        assert float(w[trained].mean()) == pytest.approx(1.0)
        assert w[-1] == 1.0
    some = noise_step_weights(_sd3_sigmas(10), [2, 5], 0.7, "flow", float(_sd3_sigmas(10)[1]))
    assert float(some[[2, 5]].mean()) == pytest.approx(1.0) and some[0] == 1.0


def test_weighted_ppo_loss_known_answer():
    lp = torch.tensor([0.0, 0.0, 0.0], requires_grad=True)
    adv = torch.tensor([1.0, -2.0, 0.5])
    w = torch.tensor([2.0, 0.5, 1.0])
    stats = ppo_clip_loss(lp, torch.zeros(3), adv, 0.1, w)
    # r = 1: each term is −A, weighted: mean(−2·1, +0.5·2, −1·0.5) = −0.5/3
    assert float(stats.loss.detach()) == pytest.approx((-2.0 + 1.0 - 0.5) / 3)
    stats.loss.backward()
    torch.testing.assert_close(lp.grad, -(w * adv) / 3)


def test_tempflow_plan_nfe_and_advantages_per_prompt_and_step():
    """Per prompt: the anchor (T forwards) and, per branch step k, G children completed
    on the full grid (T−k−1 forwards each): the doc's 15 + 6·120 at T=16 (its trunk
    skips the anchor's last step; ours finishes it, +1)."""
    P, T, G, steps = 2, 16, 6, list(range(15))
    plan = tempflow_plan(P, T, G, steps)
    assert plan.algorithm == "tempflow" and plan.granularities == [1]
    assert tree_nfe(plan) == algorithm_nfe(plan) == P * (T + G * sum(T - k - 1 for k in steps))
    assert tree_nfe(plan) == 2 * (15 + 6 * 120 + 1)
    assert plan.adv_shape == (P, len(steps), G)
    cfg = load_config(
        None,
        [
            "algorithm.name=tempflow",
            "sampling.granularities=[1]",
            f"sampling.sde_steps={steps}",
            f"sampling.group_size={G}",
            f"sampling.prompts_per_worker={P}",
        ],
    )
    from g2rpo.learner.advantages import plan_advantages

    gen = torch.Generator().manual_seed(2)
    rewards = torch.rand(len(plan.leaves), generator=gen, dtype=F64)
    adv = plan_advantages(plan, {"shapes_clip": rewards}, cfg).reshape(plan.adv_shape)
    grid = plan.gather(rewards, "branch")[:, :, 0]  # [P, K, G]
    mean, std = grid.mean(-1, keepdim=True), grid.std(-1, keepdim=True, unbiased=False)
    torch.testing.assert_close(adv, ((grid - mean) / (std + 1e-4)).clamp(-5, 5))
    with pytest.raises(ConfigError, match=r"sampling\.granularities to \[1\]"):
        load_config(None, ["algorithm.name=tempflow"])


# ------------------------------------------------------------------- Flow-GRPO-Fast


def test_flowgrpo_fast_plan_trunk_window_and_nfe():
    """One ODE trunk per prompt to its branch step k, G branches of W trained SDE steps,
    ODE to the end, G·W trained transitions. Training NFEs per prompt: k + 1 + G·(T−k−1).
    The doc's k + G·(T−k) (4 + 24·12 = 292 at k=4, G=24, T=16) is the official code's,
    which repeats the trunk state G times before its first SDE step; the engine
    evaluates that one state once (269 here). The evaluation anchor finishes the trunk."""
    plan = flowgrpo_fast_plan(2, 16, 24, window=2, branch_steps=[4, 0])
    assert algorithm_nfe(plan) == (4 + 1 + 24 * 11) + (0 + 1 + 24 * 15)
    assert tree_nfe(plan) == algorithm_nfe(plan) + (16 - 5) + 15  # the anchors' tails
    for leaf in plan.leaves:
        if leaf.kind != "sample":
            continue
        k = 4 if leaf.prompt == 0 else 0
        trained = [i for i, e in enumerate(leaf.edges) if e.trained]
        assert trained == [k, k + 1]  # the window's steps, and only they
        assert all(e.stochastic for e in leaf.edges[k : k + 2])
        assert not any(e.stochastic for i, e in enumerate(leaf.edges) if i not in (k, k + 1))
        assert {leaf.edges[i].adv_slot for i in trained} == {leaf.prompt * 24 + leaf.coords[1]}
    noises = [e.noise for leaf in plan.leaves for e in leaf.edges if e.stochastic]
    assert len(noises) == len(set(noises)) == 2 * 24 * 2
    with pytest.raises(ValueError, match="runs past"):
        flowgrpo_fast_plan(1, 16, 4, window=2, branch_steps=[14])


def test_flowgrpo_fast_draws_its_branch_step_per_prompt_from_the_config():
    cfg = load_config(None, ["algorithm.name=flowgrpo_fast", "sampling.prompts_per_worker=64"])
    plan = plan_for(cfg, 0, torch.Generator().manual_seed(0))
    steps = {
        next(i for i, e in enumerate(leaf.edges) if e.trained)
        for leaf in plan.leaves
        if leaf.kind == "sample"
    }
    assert steps == set(range(0, 16 // 2 + 1))  # uniform on 0..T//2, every value drawn
    with pytest.raises(ConfigError, match=r"algorithm\.flowgrpo_fast"):
        load_config(None, ["algorithm.name=flowgrpo_fast", "algorithm.flowgrpo_fast.window=8"])


# ---------------------------------------------------------------------- GRPO-Guard


def test_guard_ratio_is_the_noise_projection_of_the_mean_shift():
    """Under the rollout's own noise x' = μ_old + τε, RatioNorm's log r̂ is exactly
    mean(ε ⊙ δ), δ = μ_θ − μ_old (newer-methods.md §7d): 0 at δ = 0, and its gradient in
    μ_θ is ε/D because the bias b is differentiated (detaching it would leave ε − δ/τ)."""
    from g2rpo.common.algorithms.ppo import guard_log_ratio
    from g2rpo.common.algorithms.sde import gaussian_log_prob

    gen = torch.Generator().manual_seed(3)
    old_mean = torch.randn(4, 6, generator=gen, dtype=F64)
    eps = torch.randn(4, 6, generator=gen, dtype=F64)
    tau = torch.tensor([0.5, 0.2, 0.05, 0.9], dtype=F64)
    sample = old_mean + tau[:, None] * eps
    delta = 0.01 * torch.randn(4, 6, generator=gen, dtype=F64)
    mean = (old_mean + delta).requires_grad_(True)

    def guard(mean):
        lp, old = (gaussian_log_prob(sample, m, tau) for m in (mean, old_mean))
        return guard_log_ratio(lp, old, mean, old_mean, tau)

    log_ratio = guard(mean)
    torch.testing.assert_close(log_ratio, (eps * delta).mean(dim=1))
    log_ratio.sum().backward()
    torch.testing.assert_close(mean.grad, eps / 6)
    assert torch.equal(guard(old_mean), torch.zeros(4, dtype=F64))


def test_guard_loss_divides_each_step_by_its_sigma_decrement(tiny_flux):
    """The learner's GRPO-Guard loss on a rollout: the plan keeps each trained step's
    mean, the ratio before any update is exactly 1, and the loss is the surrogate of r̂
    weighted by 1/|Δσ| (known answer at r̂ = 1: mean(−A/|Δσ|))."""
    from g2rpo.common.algorithms.schedules import sampling_grid
    from g2rpo.learner.grpo import StepSpec, _chunk_loss
    from g2rpo.rollout_worker.engine import RolloutEngine, draw_noise

    cfg = load_config(
        None,
        [
            "optim.loss=grpo_guard",
            "sampling.num_steps=6",
            "sampling.sde_steps=[0,2]",
            "sampling.group_size=3",
            "sampling.prompts_per_worker=1",
        ],
    )
    gen = torch.Generator().manual_seed(0)
    plan = plan_for(cfg, 0, gen)
    assert plan.keep_means
    grid = sampling_grid(6, 3.0)
    from conftest import flux_cond

    cond = flux_cond(1)
    init, sde = draw_noise(plan, (4, 64), gen)
    result = RolloutEngine(tiny_flux, grid).run(plan, cond, init, sde)
    tr = result.transitions
    assert tr.old_means is not None and tr.old_means.shape == tr.next_samples.shape
    spec = StepSpec(grid=grid, eta=0.7, sde_type="flow", ratio_norm=True)
    adv = torch.linspace(-1, 1, len(tr), dtype=torch.float32)
    rows = torch.arange(len(tr))
    loss, stats, _ = _chunk_loss(tiny_flux, tr, cond, spec, adv, 1e-4, None, 0.0, rows)
    torch.testing.assert_close(stats.ratio, torch.ones(len(tr)), rtol=0, atol=1e-6)
    sig = grid.sigmas
    dsig = (sig[tr.state_step[tr.state_index]] - sig[tr.next_step]).float()
    torch.testing.assert_close(loss.detach(), (-adv / dsig).mean(), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------- a step without noise


def test_a_trained_step_without_noise_is_refused_at_the_rollout(tiny_flux):
    """η = 0 makes every SDE step an ODE step: a trained one has no log-prob, and the
    engine says so instead of handing the learner a NaN."""
    from conftest import flux_cond
    from g2rpo.common.algorithms.schedules import sampling_grid
    from g2rpo.rollout_worker.engine import RolloutEngine, draw_noise
    from g2rpo.rollout_worker.plan import g2rpo_plan

    plan = g2rpo_plan(1, 4, 2, [0], [1], eta=0.0)
    init, sde = draw_noise(plan, (4, 64), torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="has no noise"):
        RolloutEngine(tiny_flux, sampling_grid(4, 3.0)).run(plan, flux_cond(1), init, sde)
