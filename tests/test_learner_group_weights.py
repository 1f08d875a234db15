"""What a sharded learner group of 2 Ray actors (FSDP2 over gloo) gathers to publish and
export: bfloat16 shards gathered into exactly the bytes a float32 gather and a cast give,
and an export that writes the trained weights without initialising another model (the
group against one learner: tests/test_learner_group.py)."""

import sys

import pytest
import ray
import torch
from g2rpo.common.wire.weights import weights_checksum
from g2rpo.learner.trainer import LearnerCore
from learner_group_setup import _cfg, _max_diff, _scale_module, learner_groups
from torch.utils._python_dispatch import TorchDispatchMode

# some tests run this module's functions inside the ranks (``__ray_call__``), whose
# processes cannot import it: they travel by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def group_of(ray_local):
    """``group_of(cfg)``: a formed learner group of 2 for ``cfg``. The module's tests
    share two rank processes, reconfigured for each (as a warm run takes them,
    orchestration/warm_actors.py) instead of two new processes importing torch each."""
    yield from learner_groups()


class _Ops(TorchDispatchMode):
    """What ran inside: the dtype of every all-gather's input (its bytes on the wire),
    and every random fill of real memory (a module's initialisation; meta tensors,
    which hold none, are left out)."""

    RANDOM_FILLS = frozenset({"uniform_", "normal_", "random_", "bernoulli_", "exponential_"})

    def __init__(self):
        super().__init__()
        self.gathered: list[torch.dtype] = []
        self.random_fills = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name.startswith("all_gather"):
            self.gathered.append(args[0].dtype)
        elif name in self.RANDOM_FILLS and not args[0].is_meta:
            self.random_fills += 1
        return func(*args, **(kwargs or {}))


def _publish_seen(learner):
    """In a rank: ``weights()`` with the dtypes its all-gathers carried, and the state
    as the learner computed it before: every weight gathered whole in float32 to rank
    0's host by the state-dict API, then cast there."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    core = learner.core
    with _Ops() as ops:
        published = core.weights()
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    gathered = get_model_state_dict(core.transformer, options=options)
    dtype = getattr(torch, core.cfg.model.rollout_weights_dtype)
    cast = {k: v.to(dtype) if v.is_floating_point() else v for k, v in gathered.items()}
    return published, ops.gathered, gathered, cast


def test_sharded_publish_gathers_bfloat16_shards_into_the_bytes_a_float32_gather_gives(
    group_of, world
):
    """The shards are cast on each rank's device before the all-gather (half the
    bytes, no float32 copy on rank 0's host), and rank 0 publishes exactly the state
    gathering in float32 and casting after gave: the same tensors, bit for bit, and
    the same checksum."""
    bf16 = ["model.dtype=bfloat16", "model.rollout_weights_dtype=bfloat16"]
    group = group_of(_cfg(world, "train.learner.count=2", *bf16))
    answers = ray.get([r.__ray_call__.remote(_publish_seen) for r in group.ranks])
    (version, state, checksum), gathered0, full, expected = answers[0]
    published1, gathered1, *_ = answers[1]
    assert published1 is None  # rank 1 took part in the gathers, rank 0 publishes
    for seen in (gathered0, gathered1):  # one all-gather per tensor, each in bfloat16
        assert seen == [torch.bfloat16] * len(expected)
    assert version == 0 and list(state) == list(expected)
    for name, tensor in expected.items():
        assert state[name].dtype == tensor.dtype == torch.bfloat16, name
        assert torch.equal(state[name].view(torch.int16), tensor.view(torch.int16)), name
    assert checksum == weights_checksum(expected) == weights_checksum(state)
    # the float32 weights do not all fit bfloat16: the cast rounds (the comparison is
    # not between copies of the same bytes)
    rounded = sum(int((full[k] != expected[k].float()).sum()) for k in full)
    assert rounded > 0.9 * sum(t.numel() for t in full.values())


def _scale_weights(learner, factor: float):
    with torch.no_grad():  # a DTensor multiplies its shard
        for p in learner.core.transformer.parameters():
            p.mul_(factor)


def _trained_state(learner):
    return learner.core.trained_state()


def _export_seen(learner, directory: str):
    """In a rank: its export, with how many random fills of real memory it ran."""
    with _Ops() as ops:
        out = learner.core.export(directory)
    return out, ops.random_fills


def test_export_writes_the_trained_weights_without_initialising_another_model(
    group_of, world, tmp_path
):
    """A sharded group's export (rank 0 gathers, then writes) and one learner's
    load back with ``from_pretrained`` as exactly the trained weights (the pretrained
    ones × 1.5 on both sides, so not the files they started from), and neither fills a
    second model with random weights first."""
    from diffusers import FluxTransformer2DModel

    group = group_of(_cfg(world, "train.learner.count=2"))
    ray.get([r.__ray_call__.remote(_scale_weights, 1.5) for r in group.ranks])
    trained = ray.get([r.__ray_call__.remote(_trained_state) for r in group.ranks])[0]
    exports = ray.get(
        [r.__ray_call__.remote(_export_seen, str(tmp_path / "group")) for r in group.ranks]
    )
    assert exports[1] == (None, 0)  # rank 1 gathers; rank 0 writes
    group_dir, random_fills = exports[0]
    assert random_fills == 0

    one = LearnerCore(_cfg(world))
    _scale_module(one.transformer, 1.5)
    with _Ops() as ops:
        one_dir = one.export(str(tmp_path / "one"))
    assert ops.random_fills == 0
    assert _max_diff(trained, one.trained_state()) == 0.0  # the same weights, two ways
    for directory in (group_dir, one_dir):
        loaded = FluxTransformer2DModel.from_pretrained(directory).state_dict()
        assert sorted(loaded) == sorted(trained)
        for name, tensor in trained.items():
            assert loaded[name].dtype == torch.float32, name
            assert torch.equal(loaded[name], tensor), name
