"""A learner group of 2 Ray actors in one gloo group (FSDP2 for a full fine-tune,
data parallel for LoRA) against one learner in this process, on the same batch;
checkpoints written by one size of group read by another."""

import dataclasses

import pytest
import ray
import torch
from g2rpo.common.config import load_config
from g2rpo.common.config_train import ActorResources
from g2rpo.common.trajectories import Trajectories
from g2rpo.learner.distributed import RankShare
from g2rpo.learner.group import LearnerGroup
from g2rpo.learner.trainer import LearnerCore
from g2rpo.rollout_worker.worker import RolloutWorkerCore
from small_run import SMALL_RUN

PROMPTS = [
    "a red circle on a blue background",
    "a green square on a white background",
    "a blue triangle on a red background",
    "a yellow star on a black background",
]
LORA = ["model.lora.rank=4", "model.lora.alpha=8", "optim.lr=1e-3"]


def _cfg(world, *extra):
    # two prompts per worker (SMALL_RUN has one): each rank's share of the batches is more
    # than one prompt, and the padding case below has fewer prompts than ranks
    over = [*SMALL_RUN, "sampling.prompts_per_worker=2", f"model.pretrained={world / 'pipeline'}"]
    return load_config(None, [*over, *extra])


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
    kept: list = []

    def group_of(cfg) -> LearnerGroup:
        options, cfg_dict = ActorResources().ray_options(), cfg.model_dump(mode="json")
        if kept:
            try:
                ray.get([r.reconfigure.remote(cfg_dict, i, 2) for i, r in enumerate(kept)])
            except ray.exceptions.RayError:  # an earlier case's failure took them: new ones
                for rank in kept:
                    ray.kill(rank, no_restart=True)
                kept.clear()
        group = LearnerGroup(cfg, options, list(kept) or None)
        kept[:] = group.ranks
        group.form()
        ray.get(group.ready_refs())
        return group

    yield group_of
    for rank in kept:
        ray.kill(rank, no_restart=True)


def _published(group) -> dict[str, torch.Tensor]:
    return ray.get(group.publish().ref)


def _max_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


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
        assert alone.optimizer_steps == one.optimizer_steps == 1
        written = torch.load(shards, weights_only=False)["nft_old"]  # by the group's rank 0
        assert len(written) == len(alone.old.weights) == len(one.old.weights)
        for w, a, b in zip(written, alone.old.weights, one.old.weights, strict=True):
            assert torch.equal(w, a) and float((a - b).abs().max()) <= 1e-5
        _equal_updates(one, group, [dataclasses.replace(b, version=1) for b in batches])
    if mode == "full":  # both at v1 with the same optimizer state: the padding update
        padded = _batches(_cfg(world, "sampling.prompts_per_worker=1"), workers=1)
        _equal_updates(one, group, [dataclasses.replace(b, version=1) for b in padded])
