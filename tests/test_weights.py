"""The published-weight checksum (common/wire/weights.py): its definition as a known answer,
what it ignores (dict order, strides) and what it catches (a flipped byte anywhere, a
wrong version's state, a missing, extra, renamed, misshapen or retyped tensor); and
the learner's one-copy trained state."""

import numpy as np
import pytest
import torch
import xxhash
from g2rpo.common.config.model import LoraOptions
from g2rpo.common.families.flux import build_tiny_flux
from g2rpo.common.families.lora import adapter_state, add_lora
from g2rpo.common.wire.messages import PublishedWeights, WeightsLoaded
from g2rpo.common.wire.weights import WeightMismatch, load_published, weights_checksum
from g2rpo.learner.trainer import in_rollout_dtype, trained_state
from g2rpo.orchestration.publishing import Published, check_loaded


def test_checksum_is_xxh3_128_of_each_header_and_its_bytes_in_name_order():
    state = {
        "b": torch.tensor([1.0, -2.0], dtype=torch.bfloat16),
        "a": torch.arange(6, dtype=torch.float32).view(2, 3),
    }
    stream = (
        b'["a", "float32", [2, 3]]\n'
        + np.arange(6, dtype="<f4").tobytes()
        + b'["b", "bfloat16", [2]]\n'
        + bytes([0x80, 0x3F, 0x00, 0xC0])  # bfloat16 1.0 = 0x3f80, -2.0 = 0xc000
    )
    assert weights_checksum(state) == xxhash.xxh3_128(stream).hexdigest()


def test_order_strides_and_memory_format_do_not_change_it():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=g)
    image = torch.randn(2, 3, 4, 5, generator=g)
    strided = {"t": base.t(), "img": image.to(memory_format=torch.channels_last)}
    assert not strided["t"].is_contiguous()
    assert not strided["img"].is_contiguous()
    packed = {"img": image, "t": base.t().contiguous()}  # other insertion order too
    assert weights_checksum(strided) == weights_checksum(packed)
    as_parameter = {"img": torch.nn.Parameter(image), "t": base.t().contiguous()}
    assert weights_checksum(as_parameter) == weights_checksum(packed)


def _flipped(state: dict, name: str, at: int) -> dict:
    """A copy of ``state`` with byte ``at`` of tensor ``name`` inverted."""
    out = {k: v.clone() for k, v in state.items()}
    raw = out[name].view(-1).view(torch.uint8)
    raw[at] ^= 0xFF
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_flipped_byte_anywhere_in_a_flux_size_tensor_is_refused(dtype):
    g = torch.Generator().manual_seed(1)
    state = {
        "attn.to_q.weight": torch.randn(3072, 3072, generator=g).to(dtype),
        "norm.weight": torch.ones(3072, dtype=dtype),
    }
    checksum = weights_checksum(state)
    nbytes = state["attn.to_q.weight"].numel() * state["attn.to_q.weight"].element_size()
    model = torch.nn.Linear(1, 1)  # never reached: verification comes first
    for at in (0, nbytes // 2 + 1, nbytes - 1):
        bad = _flipped(state, "attn.to_q.weight", at)
        assert weights_checksum(bad) != checksum, at
        with pytest.raises(WeightMismatch, match="v7: checksum"):
            load_published(model, 7, bad, checksum, lora=False)


def test_one_flipped_byte_in_a_lora_adapter_state_is_refused():
    transformer = build_tiny_flux("test", seed=0)
    add_lora(transformer, LoraOptions(rank=4, alpha=8.0), seed=1)
    state = adapter_state(transformer)
    checksum = weights_checksum(state)
    load_published(transformer, 1, state, checksum, lora=True)  # the intact state loads
    name = sorted(state)[len(state) // 2]
    bad = _flipped(state, name, state[name].numel() * state[name].element_size() // 2)
    with pytest.raises(WeightMismatch, match="checksum"):
        load_published(transformer, 1, bad, checksum, lora=True)


def test_a_missing_extra_renamed_misshapen_or_retyped_tensor_changes_it():
    g = torch.Generator().manual_seed(2)
    state = {"a": torch.randn(6, 4, generator=g), "b": torch.randn(3, generator=g)}
    checksum = weights_checksum(state)
    variants = {
        "missing": {"a": state["a"]},
        "extra": {**state, "c": torch.zeros(1)},
        "renamed": {"a": state["a"], "b2": state["b"]},
        # the same bytes in another shape or dtype
        "misshapen": {"a": state["a"].reshape(4, 6), "b": state["b"]},
        "retyped": {"a": state["a"].view(torch.int32), "b": state["b"]},
    }
    for what, variant in variants.items():
        assert weights_checksum(variant) != checksum, what


def test_a_wrong_versions_weights_or_label_is_refused():
    g = torch.Generator().manual_seed(3)
    v1 = {"w": torch.randn(64, 64, generator=g)}
    v2 = {"w": v1["w"] - 1e-3 * torch.randn(64, 64, generator=g)}  # one optimizer step on
    with pytest.raises(WeightMismatch, match="v2"):
        load_published(torch.nn.Linear(64, 64, bias=False), 2, v1, weights_checksum(v2), False)
    published = Published(PublishedWeights(2, weights_checksum(v2), 64 * 64 * 4, 0.0, ref="v2"))
    check_loaded(0, WeightsLoaded(2, weights_checksum(v2)), published)
    with pytest.raises(RuntimeError, match="loaded v1"):  # right weights, old label
        check_loaded(0, WeightsLoaded(1, weights_checksum(v2)), published)


def test_trained_state_is_one_independent_copy_in_the_asked_dtype():
    transformer = build_tiny_flux("test", seed=0)
    full = trained_state(transformer, lora=False)
    half = trained_state(transformer, lora=False, dtype=torch.bfloat16)
    live = transformer.state_dict()
    for name, tensor in full.items():
        assert torch.equal(tensor, live[name])
        assert tensor.untyped_storage().data_ptr() != live[name].untyped_storage().data_ptr()
    # the cast within the copy rounds as casting the float32 copy does
    assert weights_checksum(half) == weights_checksum(in_rollout_dtype(full, torch.bfloat16))
    assert {t.dtype for t in half.values()} == {torch.bfloat16}
    with torch.no_grad():
        next(transformer.parameters()).add_(1.0)  # the learner trains in place
    assert weights_checksum(trained_state(transformer, lora=False)) != weights_checksum(full)
