"""The learner's memory levers change memory, not the update: gradient checkpointing
gives the same gradients in float32 while saving far fewer activations, and the
learner's micro-batch (train.learner.max_batch) splits the same update."""

from __future__ import annotations

from pathlib import Path

import torch
from small_run import ONE_WORKER

REPO = Path(__file__).resolve().parents[1]
SMALL = [
    *ONE_WORKER,
    "optim.step_mode=accumulate",  # one optimizer step: gradients compared before it
]
PROMPTS = ["a red circle on a blue background", "a green square on a yellow background"]


def _rollout(cfg):
    from g2rpo.reward_server.scorers.registry import make_scorer
    from g2rpo.rollout_worker.worker import RolloutWorkerCore

    worker = RolloutWorkerCore(cfg, 0)
    plan, cond, result, images = worker.sample(0, PROMPTS)
    leaf_prompts = [PROMPTS[leaf.prompt] for leaf in plan.leaves]
    scores = {"shapes_clip": make_scorer("shapes_oracle").score(images.numpy(), leaf_prompts)}
    return worker.trajectories(0, PROMPTS, plan, cond, result, scores)


def _update(extra: list[str], batch):
    """One learner update on ``batch``: (stats, gradients, weights after)."""
    from g2rpo.common.config.loading import load_config
    from g2rpo.learner.trainer import LearnerCore

    learner = LearnerCore(load_config(REPO / "configs" / "tiny.yaml", [*SMALL, *extra]))
    grads = {}
    for name, p in learner.transformer.named_parameters():
        p.register_post_accumulate_grad_hook(
            lambda p, name=name: grads.__setitem__(name, p.grad.detach().clone())
        )
    stats = learner.update([batch])
    return learner, stats, grads


def _saved_bytes(learner, batch) -> int:
    """Bytes autograd saves for the backward of one learner forward (what
    checkpointing trades for recomputation)."""
    from g2rpo.learner.grpo import recompute_log_probs

    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    tr = batch.transitions
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, _, _ = recompute_log_probs(
            learner.velocity, tr, torch.arange(len(tr)), batch.cond, learner.spec
        )
    lp.sum().backward()
    return saved[0]


def test_gradient_checkpointing_gives_the_same_gradients_from_fewer_saved_activations():
    from g2rpo.common.config.loading import load_config

    batch = _rollout(load_config(REPO / "configs" / "tiny.yaml", SMALL))
    plain, plain_stats, plain_grads = _update([], batch)
    ckpt, ckpt_stats, ckpt_grads = _update(["model.gradient_checkpointing=true"], batch)
    assert (
        ckpt.transformer.is_gradient_checkpointing
        and not plain.transformer.is_gradient_checkpointing
    )
    assert plain_grads.keys() == ckpt_grads.keys() and len(plain_grads) > 10
    for name, g in plain_grads.items():
        torch.testing.assert_close(ckpt_grads[name], g, rtol=0, atol=1e-7, msg=name)
    assert ckpt_stats["loss"] == plain_stats["loss"]
    after = ckpt.weights()[1]
    for name, w in plain.weights()[1].items():
        torch.testing.assert_close(after[name], w, rtol=0, atol=1e-7, msg=name)
    # the point of it: the blocks' activations are recomputed, not kept
    assert _saved_bytes(ckpt, batch) < 0.5 * _saved_bytes(plain, batch)


def test_the_learner_micro_batch_splits_the_same_update():
    from g2rpo.common.config.loading import load_config

    batch = _rollout(load_config(REPO / "configs" / "tiny.yaml", SMALL))
    whole, whole_stats, whole_grads = _update(["train.learner.max_batch=64"], batch)
    split, split_stats, split_grads = _update(["train.learner.max_batch=1"], batch)
    assert whole_stats["optimizer_steps"] == split_stats["optimizer_steps"] == 1
    # four distinct states (2 prompts x 2 SDE steps): one forward each either way
    assert whole_stats["nfe_learn"] == split_stats["nfe_learn"] == 4
    # the same gradient, up to the order of its sums (compared before AdamW: its first
    # step is about lr·sign(g), which turns a 1e-9 difference in a gradient element
    # near zero into lr — the weights after it differed by 5e-7 on an AVX-512 machine)
    assert whole_grads.keys() == split_grads.keys() and len(whole_grads) > 10
    for name, g in whole_grads.items():
        torch.testing.assert_close(split_grads[name], g, rtol=1e-5, atol=1e-8, msg=name)
    after = split.weights()[1]
    for name, w in whole.weights()[1].items():  # and no step larger than a rounding's
        torch.testing.assert_close(after[name], w, rtol=0, atol=2e-6, msg=name)


def test_checkpointed_blocks_recompute_under_the_forwards_attention_kernels():
    """The backward recomputes a checkpointed block under the SDPA kernels the forward
    used. diffusers' default recomputes outside ``sdpa_kernel``: on an H200 that took
    another kernel and failed the first update of every FLUX recipe that checkpoints;
    here math in the forward met the CPU flash kernel in the recompute."""
    from g2rpo.common.config.loading import load_config

    batch = _rollout(load_config(REPO / "configs" / "tiny.yaml", SMALL))
    math = ["model.attention_backend=math"]
    _, plain_stats, plain_grads = _update(math, batch)
    ckpt, ckpt_stats, ckpt_grads = _update([*math, "model.gradient_checkpointing=true"], batch)
    assert ckpt.transformer.is_gradient_checkpointing
    for name, g in plain_grads.items():
        torch.testing.assert_close(ckpt_grads[name], g, rtol=0, atol=1e-7, msg=name)
    assert ckpt_stats["loss"] == plain_stats["loss"]
