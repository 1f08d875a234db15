"""FLUX latent layout and a velocity-model adapter around diffusers' FluxTransformer2DModel.

FLUX packs a [B, C, H, W] latent into 2×2 patches: [B, (H/2)(W/2), 4C] tokens, with
3-channel image ids (0, row, col) and all-zero text ids. The engine works on packed
latents; the adapter adds ids, guidance and the per-sample timestep.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .velocity import TransformerVelocity

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] → [B, (H/2)(W/2), 4C] (diffusers FluxPipeline._pack_latents layout)."""
    b, c, h, w = latents.shape
    if h % 2 or w % 2:
        raise ValueError(f"latent height and width must be even, got {h}x{w}")
    x = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_latents(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Inverse of pack_latents for a latent of height×width (in latent pixels)."""
    b, n, d = tokens.shape
    h, w = height // 2, width // 2
    if n != h * w:
        raise ValueError(f"{n} tokens do not make a {height}x{width} latent")
    x = tokens.view(b, h, w, d // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, d // 4, height, width)


def latent_image_ids(height: int, width: int) -> torch.Tensor:
    """[(H/2)(W/2), 3] ids (0, row, col) of the packed tokens of an H×W latent."""
    ids = torch.zeros(height // 2, width // 2, 3)
    ids[..., 1] = torch.arange(height // 2)[:, None]
    ids[..., 2] = torch.arange(width // 2)[None, :]
    return ids.reshape(-1, 3)


class FluxVelocity(TransformerVelocity):
    """Adapts a FluxTransformer2DModel to the engine's VelocityModel protocol.

    cond must hold ``encoder_hidden_states`` [B, S, D] and ``pooled_projections`` [B, D].
    ``guidance`` is FLUX.1-dev's distilled guidance embedding (one call; ignored by a
    transformer without ``guidance_embeds``), not classifier-free guidance.
    Inputs stay float32 and a low-precision network runs under autocast, as the
    official code does (fp32 master weights, bf16 autocast). Note that diffusers
    casts the timestep to the activations' dtype before scaling it by 1000, so in
    bf16 FLUX sees 976 for 0.978, in the official code as here.
    """

    def __init__(
        self,
        transformer: Any,
        latent_height: int,
        latent_width: int,
        guidance: float | None = 3.5,
        autocast_dtype: torch.dtype | None = None,
        attention_backend: str = "auto",
    ) -> None:
        super().__init__(transformer, guidance, autocast_dtype, attention_backend)
        self.img_ids = latent_image_ids(latent_height, latent_width)

    def __call__(
        self, x: torch.Tensor, timestep: torch.Tensor, cond: Mapping[str, torch.Tensor]
    ) -> torch.Tensor:
        device, f32 = self.device, torch.float32
        text = cond["encoder_hidden_states"].to(device, f32)
        guidance = None
        if getattr(self.transformer.config, "guidance_embeds", False):
            guidance = torch.full((x.shape[0],), float(self.guidance or 0.0), device=device)
        return self._forward(
            hidden_states=x.to(device, f32),
            encoder_hidden_states=text,
            pooled_projections=cond["pooled_projections"].to(device, f32),
            timestep=timestep.to(device, f32),
            img_ids=self.img_ids.to(device, f32),
            txt_ids=torch.zeros(text.shape[1], 3, device=device, dtype=f32),
            guidance=guidance,
        )


def tiny_flux_config(size: str = "bench") -> dict[str, Any]:
    """FLUX-layout transformer configs built in-process (no download).

    ``test``: ~0.1M params for unit tests; ``bench``: ~1.6M params, the CPU benchmark;
    ``gpu``: a few hundred million params for the bf16 GPU benchmark; ``flux``: FLUX.1's
    width with 2 double and 4 single blocks (GPU benchmarks of FLUX-scale kernels).
    """
    presets = {
        "test": dict(
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            pooled_projection_dim=32,
            axes_dims_rope=(4, 6, 6),
        ),
        "bench": dict(
            num_layers=2,
            num_single_layers=4,
            attention_head_dim=32,
            num_attention_heads=4,
            joint_attention_dim=64,
            pooled_projection_dim=64,
            axes_dims_rope=(8, 12, 12),
        ),
        "flux": dict(  # FLUX.1 width (3072 = 24 heads x 128), 2 + 4 of its 19 + 38 blocks
            num_layers=2,
            num_single_layers=4,
            attention_head_dim=128,
            num_attention_heads=24,
            joint_attention_dim=4096,
            pooled_projection_dim=768,
            axes_dims_rope=(16, 56, 56),
        ),
        "gpu": dict(
            num_layers=4,
            num_single_layers=8,
            attention_head_dim=128,
            num_attention_heads=8,
            joint_attention_dim=1024,
            pooled_projection_dim=768,
            axes_dims_rope=(16, 56, 56),
        ),
    }
    if size not in presets:
        raise ValueError(f"unknown tiny FLUX size {size!r}; choose from {sorted(presets)}")
    return dict(patch_size=1, in_channels=64, guidance_embeds=True, **presets[size])


def build_tiny_flux(size: str = "bench", seed: int = 0, dtype: torch.dtype = torch.float32):
    """A randomly initialised FluxTransformer2DModel of a preset size."""
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    model = FluxTransformer2DModel(**tiny_flux_config(size))
    if dtype != torch.float32:
        model = model.to(dtype)
    return model.eval()


def count_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def random_text_cond(
    config: dict[str, Any], num_prompts: int, generator: torch.Generator, text_tokens: int = 8
) -> dict[str, torch.Tensor]:
    """Stand-in prompt embeddings for a transformer of ``config`` (benchmarks)."""
    return {
        "encoder_hidden_states": torch.randn(
            num_prompts, text_tokens, config["joint_attention_dim"], generator=generator
        ),
        "pooled_projections": torch.randn(
            num_prompts, config["pooled_projection_dim"], generator=generator
        ),
    }
