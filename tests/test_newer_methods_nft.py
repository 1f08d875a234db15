"""DiffusionNFT and AWM in the same engine (../shared/docs/newer-methods.md): NFT's loss,
reward weight and old-policy schedule by known answers, its plan's NFEs and a learner
update with its old policy checkpointed; AWM's term and its timestep strata (the other
newer methods: tests/test_newer_methods.py; 2 iterations through the Ray path:
tests/test_newer_methods_training.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from g2rpo.common.algorithms.rollout_plan import algorithm_nfe
from g2rpo.common.config.loading import load_config
from g2rpo.common.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


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
    from g2rpo.common.algorithms.rollout_plan import tree_nfe
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
