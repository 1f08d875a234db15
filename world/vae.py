"""The shapes world's AutoencoderKL: 16 latent channels (as FLUX), f=4 (32 px → 8×8)."""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from ..common.prompts.shapes import all_combinations, render_batch

STATS_IMAGES = 2048  # the latent mean and std are taken over this many images
VAE_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    latent_channels=16,
    down_block_types=("DownEncoderBlock2D",) * 3,
    up_block_types=("UpDecoderBlock2D",) * 3,
    block_out_channels=(32, 64, 64),
    layers_per_block=1,
    norm_num_groups=16,
    mid_block_add_attention=False,
)


def to_pixels(images: np.ndarray) -> torch.Tensor:
    """uint8 [N, H, W, 3] → float [N, 3, H, W] in [-1, 1] (diffusers' VAE range)."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1.0


def train_vae(
    steps: int,
    seed: int,
    num_images: int = 30_000,
    batch: int = 64,
    lr: float = 1e-3,
    progress: bool = True,
):
    """Train on renders of all 280 combinations (the VAE only reconstructs, so seeing
    the held-out combinations leaks nothing to the flow model). MSE + 1e-6·KL."""
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    vae = AutoencoderKL(**VAE_CONFIG)
    combos = all_combinations()
    rng = np.random.default_rng(seed)
    specs = [combos[i] for i in rng.integers(0, len(combos), num_images)]
    data = to_pixels(render_batch(specs, seed=seed + 1))
    opt = torch.optim.AdamW(vae.parameters(), lr=lr)
    bar = tqdm(range(steps), desc="vae", disable=not progress)
    for _ in bar:
        x = data[torch.from_numpy(rng.integers(0, num_images, batch))]
        post = vae.encode(x).latent_dist
        recon = vae.decode(post.sample()).sample
        mse = torch.mean((recon - x) ** 2)
        kl = post.kl().mean() / post.mean[0].numel()
        loss = mse + 1e-6 * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        bar.set_postfix(mse=f"{mse.item():.4f}")
    vae.eval()
    with torch.no_grad():  # FLUX convention: latents are (z − shift)·scale, about unit std
        n = min(num_images, STATS_IMAGES)
        z = torch.cat([vae.encode(data[i : i + 256]).latent_dist.mode() for i in range(0, n, 256)])
    vae.register_to_config(shift_factor=float(z.mean()), scaling_factor=float(1.0 / z.std()))
    return vae


@torch.no_grad()
def encode_images(vae, images: np.ndarray, batch: int = 256) -> torch.Tensor:
    """uint8 images → scaled latents [N, 16, h, w] (distribution mode)."""
    out = []
    for lo in range(0, images.shape[0], batch):
        z = vae.encode(to_pixels(images[lo : lo + batch])).latent_dist.mode()
        out.append((z - vae.config.shift_factor) * vae.config.scaling_factor)
    return torch.cat(out)
