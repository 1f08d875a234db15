import pytest
import torch
from conftest import flux_cond
from g2rpo.common.flux import (
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
