"""``g2rpo bench plan-memory``: the memory planner's sampler terms against the same
calls run on a CUDA device. For FLUX.1-dev's VAE (a decode of 1 and 4 images) and its
transformer at a few blocks (one no-grad call of each batch, 1 and 4 by default), at
each image size: the caching allocator's peak above what was allocated before the call, the CPU
fake-tensor trace of the same call (one sample's, times the batch), and what ``g2rpo
plan`` counts for it on CUDA (``planning.estimate.vae_decode_call`` and
``sampler_forward_call``; the call's inputs, the prompt embeddings among them, exist
before it and are not in the measured peak, so not in the plan column either).
``measured / plan`` above 1 means the plan undercounts that call. Random weights;
nothing is downloaded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..common.errors import UsageError

GiB = 2**30


def _peak_above_start(fn: Callable[[], object], device: torch.device) -> int:
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    result = fn()
    torch.cuda.synchronize(device)
    del result
    return torch.cuda.max_memory_allocated(device) - start


def _row(measured: int, traced: float, planned: float) -> dict[str, float]:
    return {
        "measured_gib": round(measured / GiB, 3),
        "traced_gib": round(traced / GiB, 3),
        "plan_gib": round(planned / GiB, 3),
        "measured_over_plan": round(measured / planned, 3),
    }


def bench_plan_memory(
    device: str = "cuda",
    sizes: tuple[int, ...] = (512, 720),
    blocks: tuple[int, int] = (2, 4),
    batches: tuple[int, ...] = (1, 4),
) -> dict[str, Any]:
    dev = torch.device(device)  # refused before diffusers' imports (seconds of CPU)
    if dev.type != "cuda":
        raise UsageError(f"--device {device}: this compares CUDA allocator peaks; use cuda")
    if not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is visible to torch here")
    from diffusers import AutoencoderKL

    from ..common.families.flux import FluxVelocity
    from ..common.families.flux_pipeline import latent_size
    from ..planning import estimate, trace
    from ..planning.presets import preset_config

    vae_cfg = preset_config("flux1-dev", "vae")
    tr_cfg = preset_config("flux1-dev", "transformer")
    out: dict[str, Any] = {
        "settings": {
            "device_name": torch.cuda.get_device_name(dev),
            "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.enabled,
            "sizes": list(sizes),
            "blocks": list(blocks),
            "batches": list(batches),
        }
    }
    arch = {k: v for k, v in vae_cfg.items() if not k.startswith("_")}
    vae = AutoencoderKL.from_config(arch).to(dev).eval().requires_grad_(False)
    for px in sizes:
        hw = latent_size(vae_cfg, px, px)
        per_image = trace.vae_decode_activations(vae_cfg, hw)
        for n in (1, 4):
            z = torch.randn(n, arch["latent_channels"], *hw, device=dev)

            def decode(z=z, vae=vae):
                with torch.inference_mode():
                    return vae.decode(z, return_dict=False)[0]

            planned = estimate.vae_decode_call(per_image, n, cuda=True)
            measured = _peak_above_start(decode, dev)
            out[f"vae_decode_{px}px_{n}"] = _row(measured, per_image * n, planned)
    del vae
    with torch.device(dev), trace.default_dtype(torch.bfloat16):
        model = trace.build_transformer(tr_cfg, *blocks)
    model.requires_grad_(False).eval()
    for px in sizes:
        hw = latent_size(vae_cfg, px, px)
        velocity = FluxVelocity(model, *hw, guidance=3.5, autocast_dtype=torch.bfloat16)
        shape = dict(
            latent_hw=hw,
            text_tokens=512,
            weights_dtype="bfloat16",
            autocast_dtype="bfloat16",
            train=False,
            checkpointing=False,
            lora=None,
        )
        per_sample = trace.trace_transformer_once(tr_cfg, *blocks, batch=1, **shape)
        for batch in batches:
            with torch.device(dev):  # the call's inputs exist before it, as the trace's do
                x, t, cond = trace.transformer_inputs(tr_cfg, batch, hw, 512)

            def forward(x=x, t=t, cond=cond, velocity=velocity):
                with torch.no_grad():
                    return velocity(x, t, cond)

            measured = _peak_above_start(forward, dev)
            # the plan's term without the prompt embeddings (here inputs made before the call)
            planned = estimate.sampler_forward_call(per_sample, batch, 0, cuda=True)
            out[f"transformer_{blocks[0]}+{blocks[1]}_{px}px_{batch}"] = _row(
                measured, per_sample * batch, planned
            )
    return out
