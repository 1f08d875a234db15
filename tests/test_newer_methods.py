"""The newer methods in the same engine (../shared/docs/newer-methods.md): CPS's step
(coefficients, noise, log-prob), TempFlow-GRPO's tree, noise-aware step weights and
per-(prompt, step) advantages, Flow-GRPO-Fast's trunk-and-window plan, BranchGRPO's tree
and per-depth advantages, GRPO-Guard's normalised ratio and per-step reweighting, each
method's NFEs as the doc's table derives them (2 iterations of each through the Ray path:
tests/test_newer_methods_training.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from g2rpo.common.config import ConfigError, load_config
from g2rpo.common.ppo import ppo_clip_loss
from g2rpo.common.rollout_plan import algorithm_nfe, tree_nfe
from g2rpo.common.sde import cps_coefficients, gaussian_log_prob, noise_step_weights, sde_step
from g2rpo.rollout_worker.plan import flowgrpo_fast_plan, plan_for, tempflow_plan

F64 = torch.float64
REPO = Path(__file__).resolve().parents[1]


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
    from g2rpo.common.schedules import sampling_grid
    from g2rpo.common.trajectories import Transitions
    from g2rpo.learner.grpo import StepSpec, policy_log_ratio

    grid = sampling_grid(6, 3.0)
    gen = torch.Generator().manual_seed(4)
    x_next = torch.randn(3, 5, generator=gen)
    mean_old, mean_new = torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen)
    steps = torch.tensor([0, 2, 4])
    tau = cps_coefficients(grid.sigmas[steps], grid.sigmas[steps + 1], 0.8).std
    from g2rpo.common.sde import gaussian_log_prob

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


# ----------------------------------------------------------------------- BranchGRPO


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
    from g2rpo.common.schedules import sampling_grid
    from g2rpo.common.sde import step_coefficients
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


# ---------------------------------------------------------------------- GRPO-Guard


def test_guard_ratio_is_the_noise_projection_of_the_mean_shift():
    """Under the rollout's own noise x' = μ_old + τε, RatioNorm's log r̂ is exactly
    mean(ε ⊙ δ), δ = μ_θ − μ_old (newer-methods.md §7d): 0 at δ = 0, and its gradient in
    μ_θ is ε/D because the bias b is differentiated (detaching it would leave ε − δ/τ)."""
    from g2rpo.common.ppo import guard_log_ratio
    from g2rpo.common.sde import gaussian_log_prob

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
    from g2rpo.common.schedules import sampling_grid
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


# --------------------------------------------------------------------- DiffusionNFT


def test_nft_loss_known_answers():
    """x0 = 0, x_t = 1, t = ½ (one element), c = 5. β = 1, v_θ = v_old = 1: both implicit
    policies predict x̂0 = ½, L± = ¼/½ = ½, loss = 5·½ = 2.5 for any r. β = ½, v_θ = 1,
    v_old = 0: v⁺ = ½ → x̂0⁺ = ¾, L⁺ = ¾; v⁻ = −½ → x̂0⁻ = 5/4, L⁻ = 5/4; loss 5·L/β =
    7.5 (r = 1) or 12.5 (r = 0); the adaptive scale is not differentiated, so
    ∂/∂v_θ at r = 1 is 10 · 2·¾·(−¼)/¾ = −5."""
    from g2rpo.learner.nft import nft_loss

    one, half = torch.ones(1, 1), torch.tensor([0.5])
    same = nft_loss(one, one, one, torch.zeros(1, 1), half, torch.tensor([0.3]), 1.0, 5.0)
    assert float(same) == pytest.approx(2.5)
    v = torch.ones(1, 1, requires_grad=True)
    pos = nft_loss(v, torch.zeros(1, 1), one, torch.zeros(1, 1), half, torch.ones(1), 0.5, 5.0)
    assert float(pos.detach()) == pytest.approx(7.5)
    pos.sum().backward()
    assert float(v.grad) == pytest.approx(-5.0)
    neg = nft_loss(one, torch.zeros(1, 1), one, torch.zeros(1, 1), half, torch.zeros(1), 0.5, 5.0)
    assert float(neg) == pytest.approx(12.5)


def test_nft_reward_weight_and_old_policy_schedule():
    from g2rpo.learner.nft import OldPolicy, nft_reward_weight, old_decay

    r = nft_reward_weight(torch.tensor([0.0, 5.0, -10.0, 2.5]), 5.0)
    assert r.tolist() == [0.5, 1.0, 0.0, 0.75]
    assert old_decay(100, "linear_to_0_5") == pytest.approx(0.1)
    assert old_decay(1000, "linear_to_0_5") == 0.5
    assert old_decay(74, "delayed_linear_to_0_999") == 0.0
    assert old_decay(175, "delayed_linear_to_0_999") == pytest.approx(0.75)
    assert old_decay(1000, "delayed_linear_to_0_999") == 0.999
    assert old_decay(7, "copy") == 0.0
    p = torch.nn.Parameter(torch.tensor([4.0]))
    old = OldPolicy([p])
    p.data.fill_(8.0)
    with old.swapped():
        assert float(p.detach()) == 4.0  # the old weights, inside
    assert float(p.detach()) == 8.0
    old.soft_update(0.25)
    assert float(old.weights[0]) == pytest.approx(0.25 * 4 + 0.75 * 8)


def test_nft_plan_and_a_learner_update_with_its_old_policy_checkpointed():
    """G ODE samples per prompt: P·G·T NFEs, nothing recorded, the evaluation anchor is
    sample 0's path (no extra NFE). One update on the committed world: N·(T−1)·3
    forwards (trained, old, reference), the old policy moves to λ·old + (1−λ)·θ and
    comes back from a checkpoint."""
    from g2rpo.common.rollout_plan import tree_nfe
    from g2rpo.learner.trainer import LearnerCore
    from g2rpo.rollout_worker.plan import nft_plan

    plan = nft_plan(2, 6, 4)
    assert tree_nfe(plan) == algorithm_nfe(plan) == 2 * 4 * 6
    over = [
        f"model.pretrained={REPO / 'assets' / 'shapes-world' / 'pipeline'}",
        "algorithm.name=nft",
        "sampling.num_steps=6",
        "sampling.group_size=3",
        "sampling.prompts_per_worker=2",
        "algorithm.nft.old_decay=linear_to_0_5",
    ]
    cfg = load_config(REPO / "configs" / "tiny.yaml", over)
    batch = _world_rollout(cfg)
    assert batch.leaf_latents is not None and len(batch.transitions) == 0
    learner = LearnerCore(cfg)
    before = [w.clone() for w in learner.objective.old.weights]
    stats = learner.update([batch])
    assert stats["nfe_learn"] == 6 * 5 * 3 and stats["transitions"] == 6
    # of each pair's three forwards only the trained velocity's has a backward
    assert stats["nfe_learn_no_grad"] == 6 * 5 * 2
    lam = 0.001  # one optimizer step: min(0.001·1, 0.5)
    for w, b, p in zip(learner.objective.old.weights, before, learner.trainable, strict=True):
        torch.testing.assert_close(w, lam * b + (1 - lam) * p.detach())
    again = LearnerCore(cfg)
    again.load_state_dict(learner.state_dict())
    for a, b in zip(again.objective.old.weights, learner.objective.old.weights, strict=True):
        assert torch.equal(a, b)
    assert again.objective.optimizer_steps == 1
    with pytest.raises(ConfigError, match=r"train\.learner\.count 2 needs model\.lora"):
        load_config(None, ["algorithm.name=nft", "train.learner.count=2"])
    with pytest.raises(ConfigError, match=r"awm runs on unsharded.*model\.mixed_precision"):
        load_config(
            None, ["algorithm.name=awm", "model.mixed_precision=fsdp", "model.dtype=bfloat16"]
        )
    # a LoRA group (data-parallel replicas) is fine: tests/test_learner_group.py
    load_config(None, ["algorithm.name=nft", "train.learner.count=2", "model.lora.rank=4"])


def _world_rollout(cfg):
    """One worker's scored rollout of two prompts on the committed world."""
    from g2rpo.reward_server.scorers.registry import make_scorer
    from g2rpo.rollout_worker.worker import RolloutWorkerCore

    prompts = ["a red circle on a blue background", "a green square on a yellow background"]
    worker = RolloutWorkerCore(cfg, 0)
    plan, cond, result, images = worker.sample(0, prompts)
    leaf_prompts = [prompts[leaf.prompt] for leaf in plan.leaves]
    scores = {"shapes_clip": make_scorer("shapes_oracle").score(images.numpy(), leaf_prompts)}
    return worker.trajectories(0, prompts, plan, cond, result, scores)


def test_a_trained_step_without_noise_is_refused_at_the_rollout(tiny_flux):
    """η = 0 makes every SDE step an ODE step: a trained one has no log-prob, and the
    engine says so instead of handing the learner a NaN."""
    from conftest import flux_cond
    from g2rpo.common.schedules import sampling_grid
    from g2rpo.rollout_worker.engine import RolloutEngine, draw_noise
    from g2rpo.rollout_worker.plan import g2rpo_plan

    plan = g2rpo_plan(1, 4, 2, [0], [1], eta=0.0)
    init, sde = draw_noise(plan, (4, 64), torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="has no noise"):
        RolloutEngine(tiny_flux, sampling_grid(4, 3.0)).run(plan, flux_cond(1), init, sde)


# ---------------------------------------------------------------------------- AWM


def test_awm_term_known_answer_and_its_strata():
    """One element, v_θ = 1, x0 = 0, ε = ½: L = (1 − ½)² = ¼. The term's value is −A
    (the ratio is exp(ℓ − sg ℓ) = 1) and its gradient A·t·(L + 1e-10)^(p−1)·∂L/∂v =
    2·0.4·¼^(−¾)·1 = 2.2627 at A = 2, t = 0.4, p = ¼. The strata of {1 … 11} in 6 are
    {1}, {2,3}, …, {10,11} (AWM's discrete_wo_init on 14 steps)."""
    from g2rpo.learner.nft import awm_loss, stratified_steps

    v = torch.ones(1, 1, requires_grad=True)
    term = awm_loss(
        v, torch.zeros(1, 1), torch.full((1, 1), 0.5), torch.tensor([0.4]), torch.tensor([2.0])
    )
    assert float(term.detach()) == pytest.approx(-2.0)
    term.sum().backward()
    assert float(v.grad) == pytest.approx(2 * 0.4 * 0.25 ** (-0.75), rel=1e-5)
    steps = stratified_steps(4000, 1, 12, 6, torch.Generator().manual_seed(0))
    assert set(steps[:, 0].tolist()) == {1}
    for k, stratum in enumerate([{2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}], start=1):
        assert set(steps[:, k].tolist()) == stratum
    with pytest.raises(ConfigError, match=r"algorithm\.awm\.timesteps"):
        load_config(None, ["algorithm.name=awm", "sampling.num_steps=8", "sampling.sde_steps=[0]"])
