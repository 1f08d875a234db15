"""Pretraining the shapes world's FLUX-layout transformer with the rectified-flow
objective, jointly with its two tiny text encoders."""

from __future__ import annotations

import math

import numpy as np
import torch
from tqdm.auto import tqdm

from ..common.families.flux import FluxVelocity, pack_latents
from ..common.families.flux_pipeline import encode_prompts
from ..common.prompts.shapes import ShapeSpec, render_batch
from .text import MAX_TOKENS, TEXT_DIM
from .vae import encode_images

TRANSFORMER_CONFIG = dict(
    patch_size=1,
    in_channels=64,
    num_layers=2,
    num_single_layers=4,
    attention_head_dim=32,
    num_attention_heads=4,
    joint_attention_dim=TEXT_DIM,
    pooled_projection_dim=TEXT_DIM,
    guidance_embeds=False,
    axes_dims_rope=(8, 12, 12),
)


def lr_at(step: int, total: int, warmup: int, decay: int, peak: float) -> float:
    """Linear warm-up, constant, then a linear decay to 0 over the last ``decay`` steps."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if step >= total - decay:
        return peak * max(total - step, 0) / max(decay, 1)
    return peak


def train_flow(
    vae,
    tokenizers,
    encoders,
    train_specs: list[ShapeSpec],
    *,
    steps: int,
    decay_steps: int,
    seed: int,
    num_images: int = 40_000,
    batch: int = 128,
    lr: float = 1e-3,
    progress: bool = True,
):
    """The FLUX world's transformer and text encoders trained by ``flow_matching``."""
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(**TRANSFORMER_CONFIG)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(train_specs), num_images)
    images = render_batch([train_specs[i] for i in idx], seed=seed + 2)
    latents = pack_latents(encode_images(vae, images))  # [N, 16, 64]
    prompts = [train_specs[i].prompt for i in idx]
    h = w = math.isqrt(latents.shape[1]) * 2
    velocity = FluxVelocity(transformer, h, w)
    tok, tok2 = tokenizers
    clip, t5 = encoders

    def encode(texts: list[str]) -> dict:
        return encode_prompts(tok, clip, tok2, t5, texts, MAX_TOKENS)

    ema = flow_matching(
        velocity,
        encode,
        latents,
        prompts,
        [transformer, clip, t5],
        steps=steps,
        batch=batch,
        decay_steps=decay_steps,
        lr=lr,
        rng=rng,
        progress=progress,
    )
    for m in (transformer, clip, t5):
        m.eval()
    return transformer, ema


def flow_matching(
    velocity,
    encode,
    latents: torch.Tensor,
    prompts: list[str],
    modules: list[torch.nn.Module],
    *,
    steps: int,
    batch: int,
    decay_steps: int,
    lr: float,
    rng: np.random.Generator,
    empty_prompt: str = "",
    empty_prompt_rate: float = 0.0,
    progress: bool = True,
) -> float:
    """The rectified-flow loop every family's world trains with: x_t = (1−t)·x0 + t·ε,
    target ε − x0, t ~ sigmoid(N(0,1)), on ``velocity`` (unguided) and ``encode`` (with
    gradients) over ``modules``' parameters; AdamW with warm-up and a linear-decay tail
    (worth ~10 points of shape accuracy in the notes); each prompt replaced by
    ``empty_prompt`` at ``empty_prompt_rate`` (an unconditional model for guidance).
    Returns the loss's moving average."""
    for m in modules:
        m.train().requires_grad_(True)
    params = [p for m in modules for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.99))
    warmup = 200 if steps > 400 else steps // 10 + 1
    ema = None
    bar = tqdm(range(steps), desc="flow", disable=not progress)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, warmup, decay_steps, lr)
        pick = rng.integers(0, len(prompts), batch)
        x0 = latents[torch.from_numpy(pick)]
        noise = torch.randn_like(x0)
        t = torch.sigmoid(torch.randn(batch))
        tb = t.view(-1, *[1] * (x0.dim() - 1))
        xt = (1 - tb) * x0 + tb * noise
        texts = [prompts[i] for i in pick]
        if empty_prompt_rate:  # no draws without: the FLUX world's stream stays as trained
            texts = [empty_prompt if rng.random() < empty_prompt_rate else p for p in texts]
        pred = velocity(xt, t, encode(texts))
        loss = torch.mean((pred - (noise - x0)) ** 2)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        bar.set_postfix(loss=f"{ema:.4f}")
    return float(ema)
