"""Device discipline without a GPU: the rollout worker, the learner and both
evaluators run on a stand-in accelerator (tests/fake_accelerator.py) that computes
on the CPU but refuses any op mixing its tensors with CPU tensors, as CUDA does.

What these catch is the class of bug a CPU-only CI never sees: noise drawn on the
CPU meeting conditioning on the device, trajectories sent to the driver as device
tensors, a learner taking its device from the data it was sent."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from fake_accelerator import NAME, DeviceMix, on_fake_gpu

REPO = Path(__file__).resolve().parents[1]
WORLD = REPO / "assets" / "shapes-world"
SMALL = [
    f"model.device={NAME}",
    f"model.pretrained={WORLD / 'pipeline'}",
    "sampling.num_steps=6",
    "sampling.sde_steps=[0, 2]",
    "sampling.group_size=3",
    "sampling.prompts_per_worker=2",
    "sampling.max_batch=5",  # several chunks per model call
    "sampling.decode_batch=4",
    "train.workers.count=1",
    "train.learner.max_batch=1",
]
PROMPTS = ["a red circle on a blue background", "a green square on a yellow background"]


def _tensors(obj):
    """Every tensor inside a (nested) dataclass / dict / list."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, f.name))
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from _tensors(v)


def test_the_stand_in_accelerator_refuses_what_cuda_refuses():
    with on_fake_gpu() as gpu:
        on_device = torch.randn(4, 3, device=gpu)
        with pytest.raises(DeviceMix, match="index_select"):
            on_device.index_select(0, torch.tensor([0, 2]))  # CUDA wants the index there too
        with pytest.raises(DeviceMix, match="add"):
            on_device + torch.ones(4, 3)
        with pytest.raises(DeviceMix, match="generator"):
            torch.randn(2, generator=torch.Generator().manual_seed(0), device=gpu)
        # what CUDA allows: CPU scalars, CPU indices in advanced indexing, copies
        assert (on_device * torch.tensor(2.0)).device == gpu
        assert on_device[torch.tensor([0, 2])].device == gpu
        back = on_device.cpu()
        assert back.device.type == "cpu" and torch.equal(back, on_device.cpu())
        # real values: autograd and an optimizer step run
        w = torch.nn.Parameter(torch.ones(3, device=gpu))
        (on_device @ w).sum().backward()
        grad = on_device.sum(0).cpu()
        assert w.grad.device == gpu and torch.allclose(w.grad.cpu(), grad)
        torch.optim.AdamW([w], lr=0.1, weight_decay=0.0).step()  # Adam's 1st step: lr·sign
        assert torch.allclose(w.detach().cpu(), 1.0 - 0.1 * grad.sign(), atol=1e-6)


def test_rollout_learner_and_evaluators_keep_their_tensors_on_their_devices():
    from g2rpo.common.config.loading import load_config
    from g2rpo.learner.trainer import LearnerCore
    from g2rpo.reward_server.scorers.registry import make_scorer
    from g2rpo.rollout_worker.worker import RolloutWorkerCore

    cfg = load_config(REPO / "configs" / "tiny.yaml", SMALL)
    oracle = make_scorer("shapes_oracle")
    with on_fake_gpu() as gpu:
        worker = RolloutWorkerCore(cfg, 0)
        learner = LearnerCore(cfg)
        assert worker.comps.device == gpu and learner.velocity.device == gpu
        # rollout models hold no autograd state (no autocast weight cache either)
        assert not any(p.requires_grad for p in worker.comps.transformer.parameters())

        version, state, checksum = learner.weights()
        assert {t.device.type for t in state.values()} == {"cpu"}  # published from the host
        worker.load_weights(version, state, checksum)

        plan, cond, result, images = worker.sample(0, PROMPTS)
        assert images.device.type == "cpu" and images.dtype == torch.uint8
        leaf_prompts = [PROMPTS[leaf.prompt] for leaf in plan.leaves]
        scores = {"shapes_clip": oracle.score(images.numpy(), leaf_prompts)}
        batch = worker.trajectories(0, PROMPTS, plan, cond, result, scores)
        # what crosses to the driver is on the CPU (a GPU-less head must hold it)
        assert {t.device.type for t in _tensors(batch)} == {"cpu"}

        stats = learner.update([batch])
        assert stats["optimizer_steps"] == 2 and np.isfinite(stats["loss"])
        assert abs(stats["ratio_mean"] - 1.0) < 1e-4  # rollout and learner agree on device

        # the training-time evaluator and `g2rpo eval`'s sampler
        eval_images = worker.eval_images(PROMPTS, seed=7)
        assert eval_images.shape == (2, 32, 32, 3) and eval_images.dtype == np.uint8
        from g2rpo.evaluation.evaluate import EvalSettings, sample_fixed_noise
        from g2rpo.evaluation.policy import load_policy, resolve_policy

        comps = load_policy(resolve_policy(WORLD / "pipeline"), device=NAME)
        settings = EvalSettings(image_size=32, num_steps=6, max_sequence_length=16, batch=2)
        sampled = sample_fixed_noise(comps, PROMPTS, 7, settings)
        # the same policy, the same noise, the same steps: the same images either way
        np.testing.assert_array_equal(sampled, eval_images)


def _learner_tensors(core):
    """Everything a learner core keeps: weights, buffers, gradients, optimizer state, a
    forward-process objective's old copy."""
    for module in core._held_modules():
        yield from module.parameters()
        yield from module.buffers()
        yield from (p.grad for p in module.parameters() if p.grad is not None)
    for state in core.optimizer.state.values():  # (AdamW's step counter is a CPU scalar)
        yield from (v for k, v in state.items() if torch.is_tensor(v) and k != "step")
    old = getattr(core.objective, "old", None)
    yield from old.weights if old is not None else ()


@pytest.mark.parametrize(
    "method", [["algorithm.name=g2rpo"], ["algorithm.name=nft", "algorithm.nft.timesteps=2"]]
)
def test_colocated_time_sharing_leaves_the_waiting_side_nothing_on_the_device(method):
    """train.placement colocated: while the rollout runs, the learner keeps no bytes on
    the device; while the update runs, the worker keeps none of its transformer's. The
    update and the next rollout are those of a learner and a worker that never moved."""
    from g2rpo.common.cluster.time_sharing import device_bytes
    from g2rpo.common.config.loading import load_config
    from g2rpo.learner.trainer import LearnerCore
    from g2rpo.reward_server.scorers.registry import make_scorer
    from g2rpo.rollout_worker.worker import RolloutWorkerCore

    cfg = load_config(
        REPO / "configs" / "tiny.yaml",
        # whole updates in one chunk: the chunking is test_rollout_learner_and_evaluators'
        [*SMALL, "train.placement=colocated", "train.learner.max_batch=64", *method],
    )
    oracle = make_scorer("shapes_oracle")

    def batch_of(worker, iteration):
        plan, cond, result, images = worker.sample(iteration, PROMPTS)
        leaf_prompts = [PROMPTS[leaf.prompt] for leaf in plan.leaves]
        scores = {"shapes_clip": oracle.score(images.numpy(), leaf_prompts)}
        return worker.trajectories(iteration, PROMPTS, plan, cond, result, scores)

    with on_fake_gpu():
        shared, still = RolloutWorkerCore(cfg, 0), RolloutWorkerCore(cfg, 0)
        learner, reference = LearnerCore(cfg), LearnerCore(cfg)
        published = learner.weights()
        assert learner.offload() > 0  # the rollout's turn; its seconds
        assert learner.offload() == 0.0  # nothing left to move
        assert device_bytes(_learner_tensors(learner), NAME) == 0
        shared.offload()  # as after an update: the version is loaded into the host copy
        shared.load_weights(*published)
        still.load_weights(*reference.weights())
        batch = batch_of(shared, 0)
        for a, b in zip(_tensors(batch), _tensors(batch_of(still, 0)), strict=True):
            assert torch.equal(a, b)
        shared.offload()  # the update's turn
        assert device_bytes(shared.comps.transformer.parameters(), NAME) == 0
        for version in (0, 1):  # the second update starts from moments that moved
            step = dataclasses.replace(batch, version=version)
            stats, expected = learner.update([step]), reference.update([step])
            assert stats.pop("time/learner_offload_s") > 0  # the row's two moves
            assert stats.pop("time/learner_onload_s") > 0
            assert all(t.device.type == NAME for t in _learner_tensors(learner))
            assert {k: v for k, v in stats.items() if not k.startswith("time")} == {
                k: v for k, v in expected.items() if not k.startswith("time")
            }
            learner.offload()
            assert learner.optimizer.state  # AdamW's moments exist, and are on the host
            assert device_bytes(_learner_tensors(learner), NAME) == 0
        for (name, a), (_, b) in zip(
            learner.trained_state().items(), reference.trained_state().items(), strict=True
        ):
            assert torch.equal(a, b), name


def test_train_offload_moves_only_what_it_names():
    """train.offload (issue 56): learner optimizer moves AdamW's moments and leaves the
    weights on the device; worker none keeps the transformer resident (the turn still
    frees the device's cache); the update after brings the moments back and equals one
    that never moved. On 3bb9114 every offload moved everything (no such fields read)."""
    from g2rpo.common.cluster.time_sharing import device_bytes
    from g2rpo.common.config.loading import load_config
    from g2rpo.learner.trainer import LearnerCore
    from g2rpo.reward_server.scorers.registry import make_scorer
    from g2rpo.rollout_worker.worker import RolloutWorkerCore

    over = [*SMALL, "train.placement=colocated", "train.learner.max_batch=64"]
    cfg = load_config(
        REPO / "configs" / "tiny.yaml",
        [*over, "train.offload.learner=optimizer", "train.offload.worker=none"],
    )
    oracle = make_scorer("shapes_oracle")
    with on_fake_gpu():
        worker, learner, reference = RolloutWorkerCore(cfg, 0), LearnerCore(cfg), LearnerCore(cfg)
        plan, cond, result, images = worker.sample(0, PROMPTS)
        scores = {
            "shapes_clip": oracle.score(images.numpy(), [PROMPTS[x.prompt] for x in plan.leaves])
        }
        batch = worker.trajectories(0, PROMPTS, plan, cond, result, scores)
        assert worker.offload() == 0.0  # worker none: nothing moves
        assert all(p.device.type == NAME for p in worker.comps.transformer.parameters())
        learner.update([batch]), reference.update([batch])  # AdamW's moments exist now
        assert learner.offload() > 0
        moments = [v for s in learner.optimizer.state.values() for k, v in s.items() if k != "step"]
        assert moments and device_bytes(moments, NAME) == 0  # on the host
        weights = list(learner.transformer.parameters())
        assert all(p.device.type == NAME for p in weights)  # still on the device
        step = dataclasses.replace(batch, version=1)
        stats, expected = learner.update([step]), reference.update([step])
        assert stats["time/learner_onload_s"] > 0  # the moments came back
        assert {k: v for k, v in stats.items() if not k.startswith("time")} == {
            k: v for k, v in expected.items() if not k.startswith("time")
        }


def _device_bytes_outside(core) -> int:
    """Bytes of live stand-in-device tensors that are not the pipeline's weights or
    buffers (what a rollout leaves on the device: latents, transitions, embeddings)."""
    import gc

    from fake_accelerator import OnFakeGpu

    gc.collect()
    modules = [m for m in vars(core.comps).values() if isinstance(m, torch.nn.Module)]
    held = {id(t) for m in modules for t in [*m.parameters(), *m.buffers()]}
    return sum(
        o.inner.numel() * o.inner.element_size()
        for o in gc.get_objects()
        if isinstance(o, OnFakeGpu) and id(o) not in held
    )


def test_a_colocated_worker_steps_aside_only_once_its_batch_left_the_device(scorer_url):
    """Issue 56's small item: the worker offloaded (and emptied the device's cache)
    before its trajectories were copied off the device, so the batch's device tensors
    outlived the turn's cache release and the learner found their blocks still held.
    At the offload no more of the stand-in device may be alive than before the rollout."""
    from g2rpo.common.config.loading import load_config
    from g2rpo.common.wire.messages import RewardEndpoints
    from g2rpo.rollout_worker.worker import RolloutWorkerCore

    cfg = load_config(REPO / "configs" / "tiny.yaml", [*SMALL, "train.placement=colocated"])
    with on_fake_gpu():
        worker = RolloutWorkerCore(cfg, 0)
        alive_at_offload, offload = [], worker.offload

        def offload_watched() -> float:
            alive_at_offload.append(_device_bytes_outside(worker))
            return offload()

        worker.offload = offload_watched
        before = _device_bytes_outside(worker)
        batch = worker.rollout(0, PROMPTS, RewardEndpoints([scorer_url]))
    assert len(alive_at_offload) == 1 and alive_at_offload[0] <= before, (before, alive_at_offload)
    assert batch.timings["offload_s"] > 0  # the row still gets the turn's seconds
    assert all(t.device.type == "cpu" for t in _tensors(batch))
