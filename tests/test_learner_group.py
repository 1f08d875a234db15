"""A learner group of 2 Ray actors in one gloo group (FSDP2 for a full fine-tune,
data parallel for LoRA) against one learner in this process, on the same batch;
checkpoints written by one size of group read by another; how a sharded group waits
for a slow checkpoint writer, and for rank 0's read of the weights at the start; where
the ranks meet. What a sharded group gathers to publish and export:
tests/test_learner_group_weights.py."""

import dataclasses
import sys
import time

import pytest
import ray
import torch
from g2rpo.common.wire.shared_tensors import from_wire
from g2rpo.common.wire.trajectories import Trajectories
from g2rpo.learner.distributed import RankShare
from g2rpo.learner.group import LearnerGroup
from g2rpo.learner.trainer import LearnerCore
from g2rpo.rollout_worker.worker import RolloutWorkerCore
from learner_group_setup import _cfg, _max_diff, _scale_module, learner_groups

# some tests run this module's functions inside the ranks (``__ray_call__``), whose
# processes cannot import it: they travel by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

PROMPTS = [
    "a red circle on a blue background",
    "a green square on a white background",
    "a blue triangle on a red background",
    "a yellow star on a black background",
]
LORA = ["model.lora.rank=4", "model.lora.alpha=8", "optim.lr=1e-3"]


def _batches(cfg, workers: int = 2) -> list[Trajectories]:
    """Workers' rollouts of iteration 0, with fixed made-up rewards (the update's
    input: what the rewards are does not matter here, only that both sides get them)."""
    out, n = [], cfg.sampling.prompts_per_worker
    for w in range(workers):
        prompts = PROMPTS[n * w : n * (w + 1)]
        worker = RolloutWorkerCore(cfg, w)
        plan, cond, result, _ = worker.sample(0, prompts)
        rewards = torch.rand(len(plan.leaves), generator=torch.Generator().manual_seed(w))
        out.append(worker.trajectories(0, prompts, plan, cond, result, {"shapes_clip": rewards}))
    return out


@pytest.fixture(scope="module")
def group_of(ray_local):
    """``group_of(cfg)``: a formed learner group of 2 for ``cfg``. The module's tests
    share two rank processes, reconfigured for each (as a warm run takes them,
    orchestration/warm_actors.py) instead of two new processes importing torch each."""
    yield from learner_groups()


def _published(group) -> dict[str, torch.Tensor]:
    """The version as a worker reads it: the object store's arrays as tensor views."""
    return from_wire(ray.get(group.publish().ref))


def test_each_rank_takes_a_contiguous_share_and_sharded_ranks_pad_to_the_same_count():
    rows = torch.arange(10)
    state_index = torch.tensor([0, 0, 1, 1, 2, 3, 3, 4, 4, 4])  # 5 states
    got = [RankShare(r, 2).chunks(rows, state_index, max_states=2) for r in (0, 1)]
    assert [[c.tolist() for c in g] for g in got] == [[[0, 1, 2, 3], [4]], [[5, 6, 7, 8, 9]]]
    sharded = [RankShare(r, 2, sharded=True).chunks(rows, state_index, 2) for r in (0, 1)]
    assert [len(c) for c in sharded] == [2, 2] and sharded[1][1] is None  # a padding pass
    alone = RankShare(1, 3, sharded=True).chunks(rows[:2], state_index[:2], 2)
    assert alone == [None]  # one state, three ranks: ranks 1 and 2 only pad


def _equal_updates(one: LearnerCore, group: LearnerGroup, batches) -> dict:
    """The same update by one learner and by the group: the same weights and stats."""
    before = one.trained_state()
    stats_one = one.update(batches)
    stats_two = group.update(batches)
    after_one = one.trained_state()
    assert _max_diff(after_one, _published(group)) <= 1e-5
    assert _max_diff(before, after_one) > 1e-4  # the update moved the weights
    for key in ("ratio_min", "ratio_max", "ratio_mean", "clip_fraction", "grad_norm"):
        assert stats_two[key] == pytest.approx(stats_one[key], rel=1e-5, abs=1e-7), key
    # sums in another order: float32 rounding, relative to the loss (NFT's is ~3)
    assert stats_two["loss"] == pytest.approx(stats_one["loss"], rel=1e-6, abs=1e-7)
    for key in ("nfe_learn", "nfe_learn_no_grad", "transitions", "optimizer_steps"):
        assert stats_two[key] == stats_one[key], key
    return after_one


NFT = ["algorithm.name=nft", "optim.step_mode=accumulate", *LORA]


@pytest.mark.parametrize("mode", ["full", "lora", "nft"])
def test_two_rank_update_equals_one_rank_update(group_of, world, mode, tmp_path):
    """Then checkpoints across group sizes, and (full) an update on one prompt of one
    worker, so each SDE step has one state and rank 1 runs only padding passes (it
    must still take part in every collective). nft: DiffusionNFT's forward-process
    update on a LoRA group, the ranks splitting the (sample, t) pairs; its old copy
    travels in the checkpoint, and a second update (which reads it) agrees too."""
    extra = {"full": [], "lora": LORA, "nft": NFT}[mode]
    cfg = _cfg(world, *extra)
    batches = _batches(cfg, workers=2)
    one = LearnerCore(cfg)
    group = group_of(_cfg(world, "train.learner.count=2", *extra))
    after_one = _equal_updates(one, group, batches)
    after_two = _published(group)
    # checkpoints: the group's read by one learner, one learner's by the group
    if mode == "full":
        shards = tmp_path / "it_00001.dcp"
        group.save(str(shards))
        assert sorted(p.name for p in shards.glob("*.distcp")) == [
            "__0_0.distcp",
            "__1_0.distcp",
        ]  # each rank wrote its shards
    else:
        shards = tmp_path / "it_00001.pt"  # data-parallel replicas: rank 0 writes one file
        group.save(str(shards))
    alone = LearnerCore(cfg)
    assert alone.load(str(shards)) == 1 and alone.version == 1
    assert _max_diff(alone.trained_state(), after_two) == 0.0
    moments = [s["exp_avg_sq"] for s in alone.optimizer.state_dict()["state"].values()]
    reference = [s["exp_avg_sq"] for s in one.optimizer.state_dict()["state"].values()]
    assert len(moments) == len(reference) == len(one.trainable)
    assert max(float((a - b).abs().max()) for a, b in zip(moments, reference, strict=True)) < 1e-9

    single = tmp_path / "single.pt"
    torch.save(one.state_dict(), single)
    assert group.load(str(single)) == 1
    assert _max_diff(_published(group), after_one) == 0.0

    if mode == "nft":  # the old copy came through both ways: the next update agrees
        assert alone.objective.optimizer_steps == one.objective.optimizer_steps == 1
        written = torch.load(shards, weights_only=False)["nft_old"]  # by the group's rank 0
        assert len(written) == len(alone.objective.old.weights) == len(one.objective.old.weights)
        for w, a, b in zip(
            written, alone.objective.old.weights, one.objective.old.weights, strict=True
        ):
            assert torch.equal(w, a) and float((a - b).abs().max()) <= 1e-5
        _equal_updates(one, group, [dataclasses.replace(b, version=1) for b in batches])
    if mode == "full":  # both at v1 with the same optimizer state: the padding update
        padded = _batches(_cfg(world, "sampling.prompts_per_worker=1"), workers=1)
        _equal_updates(one, group, [dataclasses.replace(b, version=1) for b in padded])


def _checkpoint_with_a_slow_rank(learner, directory: str, delay_s: float):
    """In a rank: save then load a sharded checkpoint while rank 1 is ``delay_s``
    late at each point where the ranks wait for each other (before the save, in its
    writes, in its reads), with the default group's timeout a third of that, as a
    short NCCL watchdog would have it. Returns (weights saved, weights loaded, the
    version loaded)."""
    import contextlib
    from datetime import timedelta
    from unittest import mock

    import torch.distributed as dist
    from g2rpo.common.cluster.timeouts import collective_timeout_s
    from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter

    def late(cls, name):
        if learner.rank != 1:
            return contextlib.nullcontext()
        method = getattr(cls, name)

        def slow(*args, **kwargs):
            time.sleep(delay_s)
            return method(*args, **kwargs)

        return mock.patch.object(cls, name, slow)

    core = learner.core
    saved = core.trained_state()  # collectives over the default group, before it shrinks
    set_timeout = dist.distributed_c10d._set_pg_timeout  # the default group's
    set_timeout(timedelta(seconds=delay_s / 3))
    try:
        core.version = 7
        if learner.rank == 1:
            time.sleep(delay_s)  # rank 0 waits in the barrier after removing the partial
        with late(FileSystemWriter, "write_data"):
            core.save(directory)
        _scale_module(core.transformer, 0.5)  # what the load must undo
        core.version = 0
        with late(FileSystemReader, "read_data"):
            core.load(directory)
    finally:
        set_timeout(timedelta(seconds=collective_timeout_s(core.cfg)))
    return saved, core.trained_state(), core.version


def test_ranks_wait_for_a_slow_checkpoint_writer_longer_than_the_default_groups_timeout(
    group_of, world, tmp_path
):
    """Checkpoints coordinate over the group's gloo checkpoint group, whose timeout
    allows for the slowest writer: a rank late by 3× the default group's timeout at
    the barrier, in its writes and in its reads fails nothing, and the checkpoint
    (replacing a stale partial) loads back what was saved."""
    group = group_of(_cfg(world, "train.learner.count=2"))
    directory = tmp_path / "it_00007.dcp"
    stale = tmp_path / "it_00007.dcp.partial"
    stale.mkdir()
    (stale / "left_by_a_crash").write_text("")
    answers = ray.get(
        [
            r.__ray_call__.remote(_checkpoint_with_a_slow_rank, str(directory), 1.5)
            for r in group.ranks
        ]
    )
    saved, loaded, version = answers[0]
    assert version == answers[1][2] == 7
    assert _max_diff(saved, loaded) == 0.0
    assert not stale.exists() and not (directory / "left_by_a_crash").exists()
    assert sorted(p.name for p in directory.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]


def _slow_next_read(learner, delay_s: float):
    """In a rank: its next read of a pretrained transformer takes ``delay_s`` longer
    (shared storage at FLUX scale); the one after is as before."""
    from diffusers import FluxTransformer2DModel

    own = FluxTransformer2DModel.__dict__.get("from_pretrained")

    def slow(*args, **kwargs):
        if own is None:
            del FluxTransformer2DModel.from_pretrained
        else:
            FluxTransformer2DModel.from_pretrained = own
        time.sleep(delay_s)
        return FluxTransformer2DModel.from_pretrained(*args, **kwargs)

    FluxTransformer2DModel.from_pretrained = staticmethod(slow)


def test_a_sharded_group_forms_after_rank_0_read_its_weights_however_long_that_takes(
    group_of, world
):
    """Rank 0 reads the weights for a while longer than the collective timeout: the
    other ranks wait for it before the group forms (in Ray), not in the group's first
    collective, and the shards then hold the weights read from disk."""
    from safetensors.torch import load_file

    cfg = _cfg(world, "train.learner.count=2", "train.collective_timeout_s=5")

    def slow_rank0(group):
        ray.get(group.rank0.__ray_call__.remote(_slow_next_read, 8.0))

    started = time.monotonic()
    group = group_of(cfg, before_form=slow_rank0)
    assert time.monotonic() - started > 8.0  # the read was slow
    state = _published(group)
    on_disk = load_file(world / "pipeline" / "transformer" / "diffusion_pytorch_model.safetensors")
    assert sorted(state) == sorted(on_disk)
    assert all(torch.equal(state[k], on_disk[k]) for k in on_disk)


def _socket_env(learner):
    import os

    from g2rpo.common.cluster.net import interface_of

    node_ip = ray.util.get_node_ip_address()
    env = {k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}
    return env, interface_of(node_ip)


def test_the_ranks_meet_on_the_interface_of_rays_node_ip(group_of, world):
    """gloo and NCCL would take the hostname's interface (loopback where /etc/hosts says
    127.0.1.1: a join across nodes then hangs, tests/test_socket_interfaces.py); each
    rank of a group points them at the interface holding Ray's node IP."""
    group = group_of(_cfg(world, "train.learner.count=2"))
    for env, interface in ray.get([r.__ray_call__.remote(_socket_env) for r in group.ranks]):
        assert interface is not None
        assert env == {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": f"={interface}"}
