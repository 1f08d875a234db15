import pytest
import torch
from conftest import flux_cond
from g2rpo.common.families.flux import (
    build_tiny_flux,
    count_parameters,
    latent_image_ids,
    pack_latents,
    unpack_latents,
)


def test_pack_matches_diffusers_flux_pipeline():
    from diffusers import FluxPipeline

    lat = torch.randn(2, 16, 8, 6)
    ours = pack_latents(lat)
    theirs = FluxPipeline._pack_latents(lat, 2, 16, 8, 6)
    assert torch.equal(ours, theirs)
    assert torch.equal(unpack_latents(ours, 8, 6), lat)
    ids = FluxPipeline._prepare_latent_image_ids(2, 4, 3, "cpu", torch.float32)
    assert torch.equal(latent_image_ids(8, 6), ids)
    with pytest.raises(ValueError, match="even"):
        pack_latents(torch.randn(1, 16, 7, 8))


def test_per_sample_timesteps_match_single_calls(tiny_flux):
    cond = flux_cond(3)
    x = torch.randn(3, 4, 64)
    t = torch.tensor([1.0, 0.5, 0.166])
    with torch.no_grad():
        batched = tiny_flux(x, t, cond)
        single = torch.cat(
            [
                tiny_flux(x[i : i + 1], t[i : i + 1], {k: c[i : i + 1] for k, c in cond.items()})
                for i in range(3)
            ]
        )
    assert batched.shape == x.shape and batched.dtype == torch.float32
    assert torch.allclose(batched, single, atol=1e-5)
    assert not torch.allclose(batched[0], batched[1])


def test_bench_preset_is_big_enough():
    assert count_parameters(build_tiny_flux("bench")) >= 1_000_000
    with pytest.raises(ValueError, match="unknown"):
        build_tiny_flux("huge")


def test_bf16_network_runs_under_autocast_with_fp32_inputs():
    """As the official code (fp32 inputs, bf16 autocast): the network gets fp32 latents
    and timesteps; diffusers then rounds the timestep to the activations' dtype itself."""
    from g2rpo.common.families.flux import FluxVelocity

    model = build_tiny_flux("test", dtype=torch.bfloat16)
    seen = []
    model.x_embedder.register_forward_pre_hook(lambda mod, args: seen.append(args[0].dtype))
    vel = FluxVelocity(model, 4, 4)
    with torch.no_grad():
        out = vel(torch.randn(2, 4, 64), torch.tensor([0.978, 0.409]), flux_cond(2))
    assert seen == [torch.float32]
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


def test_attention_backend_restricts_the_sdpa_kernels():
    """auto == math on CPU (the same attention, other kernel); a kernel the device
    lacks fails naming the config field instead of a bare torch error."""
    from g2rpo.common.families.flux import FluxVelocity
    from g2rpo.common.families.transformer_call import AttentionBackendError

    model = build_tiny_flux("test", seed=0)
    x, t, cond = torch.randn(2, 4, 64), torch.tensor([0.9, 0.3]), flux_cond(2)
    with torch.no_grad():
        auto = FluxVelocity(model, 4, 4)(x, t, cond)
        math = FluxVelocity(model, 4, 4, attention_backend="math")(x, t, cond)
        torch.testing.assert_close(auto, math, rtol=1e-5, atol=1e-6)
        with pytest.raises(AttentionBackendError, match=r"model\.attention_backend=cudnn"):
            FluxVelocity(model, 4, 4, attention_backend="cudnn")(x, t, cond)
    with pytest.raises(ValueError, match=r"model\.attention_backend"):
        FluxVelocity(model, 4, 4, attention_backend="fastest")


def test_attention_backend_is_a_config_field():
    from g2rpo.common.config.loading import load_config
    from g2rpo.common.errors import ConfigError

    assert load_config(None).model.attention_backend == "auto"
    with pytest.raises(ConfigError, match=r"model\.attention_backend"):
        load_config(None, ["model.attention_backend=fastest"])


def test_flop_counter_known_answer():
    """A linear layer costs 2·B·in·out FLOPs forward and twice that backward."""
    from g2rpo.common.algorithms.flops import count_flops, utilisation

    layer = torch.nn.Linear(32, 16, bias=False)
    x = torch.randn(8, 32, requires_grad=True)
    assert count_flops(lambda: layer(x)) == 2 * 8 * 32 * 16
    assert count_flops(lambda: layer(x).sum().backward()) == 3 * 2 * 8 * 32 * 16
    assert utilisation(2e12, 2.0, 10.0) == {"tflops": 1.0, "mfu": 0.1}
    assert utilisation(2e12, 2.0, None)["mfu"] is None


def test_update_flops_charges_a_backward_only_to_trained_forwards():
    """The doctor's learner FLOPs: measured on a layer (trained, frozen, and frozen with
    a trained input as under LoRA), then DiffusionNFT's LoRA update on FLUX's recipe (216
    pairs, each a trained, an old and a reference forward), which the second GPU run's
    doctor had charged a full backward for all 648 (MFU 0.71 instead of 0.30)."""
    from g2rpo.common.algorithms.flops import count_flops, update_flops

    layer = torch.nn.Linear(32, 16, bias=False)
    x = torch.randn(8, 32, requires_grad=True)
    one = count_flops(lambda: layer(x))

    def trained_and_frozen():
        layer(x).sum().backward()
        with torch.no_grad():
            layer(x)

    assert update_flops(one, 2, 1, checkpointing=False) == count_flops(trained_and_frozen)
    base = torch.nn.Linear(32, 16, bias=False).requires_grad_(False)  # LoRA's frozen base
    lora_like = update_flops(one, 1, 0, checkpointing=False, frozen_base=True)
    assert lora_like == count_flops(lambda: base(x).sum().backward())
    assert update_flops(1.0, 648, 432, checkpointing=True, frozen_base=True) == 216 * 3 + 432
    assert update_flops(1.0, 8, 0, checkpointing=False) == 24
    with pytest.raises(ValueError, match=r"no_grad_forwards \(3\) exceeds forwards \(2\)"):
        update_flops(1.0, 2, 3, checkpointing=False)


def test_checkpointing_func_gives_the_recompute_the_forwards_input_dtype():
    """FSDP2 casts a block's inputs to its param dtype in the forward, but torch 2.11
    skips that cast when the backward recomputes the block (float32 then, bfloat16
    before: the learner's first update failed on an H200). Cast before the checkpoint,
    both passes get bfloat16, nested arguments (FLUX's rotary pair) included; integer
    tensors and non-tensors pass as they are."""
    from g2rpo.common.families.transformer_call import checkpointing_func

    seen = []

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))

        def forward(self, x, rotary, ids, extra):
            seen.append((x.dtype, rotary[0].dtype, rotary[1].dtype, ids.dtype, extra))
            return (x * self.w * rotary[0] * rotary[1]).sum()

    block = Block()
    args = (torch.randn(3), (torch.randn(3), torch.randn(3)), torch.arange(3), None)
    checkpointing_func("auto", torch.bfloat16)(block, *args).backward()
    bf16 = torch.bfloat16
    assert seen == [(bf16, bf16, bf16, torch.int64, None)] * 2  # forward, then recompute
    assert block.w.grad is not None
    seen.clear()
    block.w = torch.nn.Parameter(torch.ones(3))
    checkpointing_func("auto")(block, *args).backward()  # no dtype: nothing is cast
    assert {s[:3] for s in seen} == {(torch.float32,) * 3} and len(seen) == 2
