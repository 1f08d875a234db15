"""A published weight version reaches the workers of a node without private copies
(issue 55): put as NumPy arrays (``common/wire/weights.publishable``) it is one copy in the
node's object store, which each worker verifies and copies into its own weights from
read-only views (``load_published``). At 3bb9114 a version crossed Ray as torch tensors
and every worker unpickled the whole of it into its own memory (measured here: twice
the version at the peak); these tests fail there (no ``publishable``)."""

import numpy as np
import pytest
import ray
import torch
from g2rpo.benchmarks.weights_memory import bench_weights_memory
from g2rpo.common.config.model import LoraOptions
from g2rpo.common.families.flux import build_tiny_flux
from g2rpo.common.families.lora import adapter_state, add_lora
from g2rpo.common.wire.weights import load_published, publishable, weights_checksum
from g2rpo.learner.staged_versions import StagedVersions

MiB = 2**20
VERSION = 64 * MiB
# what a worker allocates while loading, whatever the version's size: the deserialised
# dict and its tensor objects, the checksum's state, allocator slack
LOAD_CONSTANT = 8 * MiB


@pytest.mark.parametrize("pickled", [False, True], ids=["zero-copy", "pickled"])
def test_a_worker_loads_a_version_without_a_private_copy(ray_local, pickled):
    """Two workers on this node load one 64 MiB bf16 version; their private memory
    (RssAnon, sampled every ms) grows by at most 10% of it + LOAD_CONSTANT, while the
    old path (torch tensors) grows by at least 80% (catches a version unpickled into
    each worker: the control shows the measurement sees one)."""
    r = bench_weights_memory(VERSION, pickled=pickled, workers=2)
    assert r["version_bytes"] == pytest.approx(VERSION, rel=0.01)
    for w in r["workers"]:
        private = w["private_growth_mib"] * MiB
        if pickled:
            assert private >= 0.8 * VERSION, r
        else:
            assert private <= 0.1 * VERSION + LOAD_CONSTANT, r
            # the version's pages are mapped from the store, not copied: shared memory
            assert w["shared_mapped_mib"] * MiB + w["file_mapped_mib"] * MiB >= 0.8 * VERSION, r


def test_the_collective_transports_object_store_copy_is_the_shared_form(ray_local):
    """A staged version put for a worker outside the broadcast (restarted, the evaluator,
    the fallback) comes back as read-only arrays; loading copies out of them into
    writable weights of the worker's own, and the broadcast reads it as tensors."""
    g = torch.Generator().manual_seed(0)
    state = {
        "w": torch.randn(512, 512, generator=g).bfloat16(),  # 512 KiB: shared
        "b": torch.randn(8, generator=g),  # pickled as it is
    }
    checksum = weights_checksum(state)
    staged = StagedVersions(1)
    staged.add(3, {k: v.clone() for k, v in state.items()})
    got = ray.get(staged.object_ref(3))
    array = got["w"].array
    assert isinstance(array, np.ndarray) and not array.flags.writeable
    assert array.dtype == np.int16  # bfloat16's carrier
    assert weights_checksum(staged.state(3)) == checksum
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.zeros(512, 512, dtype=torch.bfloat16))
    model.b = torch.nn.Parameter(torch.zeros(8))
    load_published(model, 3, got, checksum, lora=False)
    assert weights_checksum(dict(model.state_dict())) == checksum
    with torch.no_grad():
        model.w.add_(1)  # the worker's own memory: writable, and the store's copy intact
    assert weights_checksum(staged.state(3)) == checksum


def test_lora_adapters_cross_as_shared_arrays_and_load():
    """A LoRA run publishes its adapters the same way: each adapter of at least 16 KiB
    becomes an array, and the adapters load strictly from them."""
    transformer = build_tiny_flux("bench", seed=0)  # 128 wide: rank 64's adapters are 32 KiB
    add_lora(transformer, LoraOptions(rank=64, alpha=128.0), seed=1)
    state = adapter_state(transformer)
    wire = publishable(state)
    shared = [k for k, v in wire.items() if not isinstance(v, torch.Tensor)]
    big = [k for k, v in state.items() if v.numel() * v.element_size() >= 16 * 2**10]
    assert big and shared == big
    with torch.no_grad():
        for p in transformer.parameters():
            p.zero_()
    load_published(transformer, 1, wire, weights_checksum(state), lora=True)
    assert weights_checksum(adapter_state(transformer)) == weights_checksum(state)
