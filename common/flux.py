"""FLUX latent layout and a velocity-model adapter around diffusers' FluxTransformer2DModel.

FLUX packs a [B, C, H, W] latent into 2×2 patches: [B, (H/2)(W/2), 4C] tokens, with
3-channel image ids (0, row, col) and all-zero text ids. The engine works on packed
latents; the adapter adds ids, guidance and the per-sample timestep.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class AttentionBackendError(RuntimeError):
    """The transformer failed under the attention kernels ``model.attention_backend`` allows."""


def sdpa_backends(name: str) -> list:
    """The torch SDPA kernels a ``model.attention_backend`` value allows. ``auto`` is
    every kernel but cuDNN's: its fused attention backward crashed a FLUX-width
    learner on an H100 (torch 2.11, cuDNN 9.19: ``mha_graph.execute`` failing, later
    ``CUBLAS_STATUS_EXECUTION_FAILED``); on CPU it changes nothing."""
    from torch.nn.attention import SDPBackend as B

    table = {
        "auto": [B.FLASH_ATTENTION, B.EFFICIENT_ATTENTION, B.MATH],
        "flash": [B.FLASH_ATTENTION],
        "efficient": [B.EFFICIENT_ATTENTION],
        "cudnn": [B.CUDNN_ATTENTION],
        "math": [B.MATH],
    }
    if name not in table:
        raise ValueError(f"model.attention_backend must be one of {sorted(table)}, got {name!r}")
    return table[name]


def backend_failure(name: str, exc: BaseException) -> AttentionBackendError:
    kernels = ", ".join(b.name for b in sdpa_backends(name))
    return AttentionBackendError(
        f"transformer failed with model.attention_backend={name} (SDPA kernels: {kernels}): "
        f"{exc}. If this is about attention, choose another model.attention_backend "
        "(auto, flash, efficient, math)"
    )


def checkpointing_func(attention_backend: str, input_dtype: torch.dtype | None = None):
    """diffusers' ``gradient_checkpointing_func`` whose backward recomputes a block as
    its forward ran it. diffusers' default re-runs the block outside two things the
    forward had (both failed the learner's first update on an H200, torch 2.11: "Recomputed
    values ... have different metadata"):

    - the ``sdpa_kernel`` choice of ``model.attention_backend``: a context the backward
      has left, so the recompute may take another kernel that saves other tensors
      (reproduced on CPU: math in the forward, the CPU flash kernel in the recompute);
    - FSDP2's cast of a block's inputs to its ``param_dtype``, which torch 2.11 skips
      while the block's FSDP state is in its backward (2.13 casts there too): the
      recompute saw float32 where the forward saw bfloat16. ``input_dtype`` (the
      policy's ``param_dtype``) casts them before the checkpoint, so both passes get
      the cast the forward would have made anyway."""
    from torch.nn.attention import sdpa_kernel
    from torch.utils._pytree import tree_map
    from torch.utils.checkpoint import checkpoint

    kernels = sdpa_backends(attention_backend)

    def cast(x):
        if input_dtype is not None and isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.to(input_dtype)
        return x

    def in_kernels(block, *args):
        with sdpa_kernel(kernels):
            return block(*args)

    def run(block, *args):
        return checkpoint(in_kernels, block, *tree_map(cast, args), use_reentrant=False)

    return run


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


class FluxVelocity:
    """Adapts a FluxTransformer2DModel to the engine's VelocityModel protocol.

    cond must hold ``encoder_hidden_states`` [B, S, D] and ``pooled_projections`` [B, D].
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
        self.transformer = transformer
        self.img_ids = latent_image_ids(latent_height, latent_width)
        self.guidance = guidance
        self.autocast_dtype = autocast_dtype
        self.attention_backend = attention_backend
        sdpa_backends(attention_backend)  # an unknown backend is refused here, not at a call
        self.calls = 0

    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    def _compute_dtype(self) -> torch.dtype | None:
        return compute_dtype(self.transformer, self.autocast_dtype)

    def __call__(
        self, x: torch.Tensor, timestep: torch.Tensor, cond: Mapping[str, torch.Tensor]
    ) -> torch.Tensor:
        device = self.device
        f32 = torch.float32
        text = cond["encoder_hidden_states"].to(device, f32)
        guidance = None
        if getattr(self.transformer.config, "guidance_embeds", False):
            guidance = torch.full((x.shape[0],), float(self.guidance or 0.0), device=device)
        self.calls += 1
        with transformer_call(device, self._compute_dtype(), self.attention_backend):
            out = self.transformer(
                hidden_states=x.to(device, f32),
                encoder_hidden_states=text,
                pooled_projections=cond["pooled_projections"].to(device, f32),
                timestep=timestep.to(device, f32),
                img_ids=self.img_ids.to(device, f32),
                txt_ids=torch.zeros(text.shape[1], 3, device=device, dtype=f32),
                guidance=guidance,
                return_dict=False,
            )[0]
        return out.to(f32)


def compute_dtype(transformer: Any, autocast_dtype: torch.dtype | None) -> torch.dtype | None:
    """The dtype a velocity adapter's call computes in: ``autocast_dtype``, else the
    weights' own when they are not float32 (None: plain float32)."""
    if autocast_dtype is not None:
        return autocast_dtype
    param_dtype = next(transformer.parameters()).dtype
    return None if param_dtype == torch.float32 else param_dtype


@contextmanager
def transformer_call(device: torch.device, compute: torch.dtype | None, attention_backend: str):
    """Every family's transformer call: autocast to ``compute`` (off for None), the
    SDPA kernels ``model.attention_backend`` allows, and errors naming that backend."""
    from torch.nn.attention import sdpa_kernel

    with (
        # no weight cache: it would hold a low-precision copy of every weight for the
        # whole forward, defeating gradient checkpointing (the copies a backward
        # needs are saved by autograd either way)
        torch.autocast(
            device.type,
            dtype=compute or torch.float32,
            enabled=compute is not None,
            cache_enabled=False,
        ),
        sdpa_kernel(sdpa_backends(attention_backend)),
        naming_backend(attention_backend),
    ):
        yield


@contextmanager
def naming_backend(name: str):
    """Re-raise a RuntimeError from inside the block naming the attention backend."""
    try:
        yield
    except AttentionBackendError:
        raise
    except RuntimeError as exc:
        if _collective_failure(exc):  # a learner group's peer, not attention
            raise
        raise backend_failure(name, exc) from exc


def _collective_failure(exc: RuntimeError) -> bool:
    import torch.distributed as dist

    text = str(exc)
    return isinstance(exc, dist.DistError) or "Gloo" in text or "NCCL" in text


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
