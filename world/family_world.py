"""``g2rpo pretrain --family sd3|qwenimage``: the shapes world in StableDiffusion3Pipeline's
or QwenImagePipeline's layout, trained by the FLUX world's objective.

SD3 reuses the FLUX world's trained VAE as it is (SD3's VAE is the same AutoencoderKL
class, 16 latent channels, (z − shift)·scale), so both worlds see the same latents.
Qwen-Image's 3-D VAE (AutoencoderKLQwenImage, 4x here as the FLUX world's, so a 32²
image is 16 tokens) is trained like the FLUX world's on renders of every combination,
then given the per-channel latent mean and std its config carries. The transformer
and the family's text encoders (``world/sd3_random.py``'s CLIP-L, CLIP-G and T5;
``world/qwenimage_random.py``'s Qwen2.5-VL and byte-level tokenizer) are trained
together on the training split with the rectified-flow loss through the family's own
velocity adapter and prompt encoding, exactly as the rollout calls them. One prompt in
ten is replaced by the family's negative prompt (SD3: empty; Qwen-Image: " "), so that
the classifier-free guidance the family samples with has an unconditional model to
extrapolate from. ``shapes_clip`` is copied from the FLUX world (a reward does not
depend on the policy's layout).

OUT/pipeline/      the family's pipeline directory
OUT/shapes_clip/   the FLUX world's in-domain reward
OUT/world.json     seed, command, settings, split, timings, losses
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..common.errors import UsageError
from ..common.paths import DEFAULT_WORLD
from ..common.prompts.shapes import SPLIT_SEED, ShapeSpec, render_batch, split_combinations
from .flow import flow_matching
from .pretrain import FULL, QUICK, PretrainSettings
from .text import MAX_TOKENS
from .vae import encode_images

FAMILIES = ("sd3", "qwenimage")
QWEN_VAE = dict(  # 4x as the FLUX world's VAE: 2 ** len(temperal_downsample)
    base_dim=16, z_dim=16, dim_mult=[1, 2, 2], num_res_blocks=1, temperal_downsample=[False, True]
)
EMPTY_PROMPT_RATE = 0.1  # caption dropout: the unconditional model CFG extrapolates from
IMAGE_SIZE = 32


def sd3_transformer_config() -> dict:
    """The SD3 world's MMDiT: the FLUX world's width (4 heads of 32), 6 layers (its 2
    double-stream + 4 single-stream blocks), SD3's 2x2 patches on the 8x8 latent."""
    from .sd3_random import POOLED_DIM, T5_DIM

    return dict(
        sample_size=8,
        patch_size=2,
        in_channels=16,
        num_layers=6,
        attention_head_dim=32,
        num_attention_heads=4,
        joint_attention_dim=T5_DIM,
        caption_projection_dim=128,
        pooled_projection_dim=POOLED_DIM,
        out_channels=16,
        pos_embed_max_size=16,
    )


def _sd3_components(flux_world: Path, seed: int):
    from diffusers import AutoencoderKL, SD3Transformer2DModel

    from ..common.families.sd3_pipeline import SD3Components
    from .sd3_random import sd3_text_stack

    torch.manual_seed(seed)
    vae = AutoencoderKL.from_pretrained(flux_world / "pipeline" / "vae", local_files_only=True)
    text = sd3_text_stack(clip_tokens=MAX_TOKENS)
    transformer = SD3Transformer2DModel(**sd3_transformer_config())
    return SD3Components(transformer=transformer, vae=vae.eval(), **text), text


def _qwenimage_components(settings: PretrainSettings, seed: int, progress: bool):
    from ..common.families.qwenimage_pipeline import QwenImageComponents
    from .qwenimage_random import build_qwen_text_encoder, build_qwen_tokenizer, qwen_transformer

    torch.manual_seed(seed)
    tokenizer = build_qwen_tokenizer()
    text_encoder = build_qwen_text_encoder(len(tokenizer))
    joint = text_encoder.config.text_config.hidden_size
    transformer = qwen_transformer(6, 4, 32, joint, (8, 12, 12))
    vae = train_qwen_vae(settings, seed, progress)
    comps = QwenImageComponents(transformer, vae, text_encoder, tokenizer)
    return comps, [text_encoder]


def train_qwen_vae(settings: PretrainSettings, seed: int, progress: bool = True):
    """AutoencoderKLQwenImage trained as ``world/vae.py`` trains the FLUX world's (MSE +
    1e-6·KL on renders of all combinations, one-frame videos), then given the latents'
    per-channel mean and std (QwenImagePipeline decodes z·std + mean)."""
    from diffusers import AutoencoderKLQwenImage

    from ..common.prompts.shapes import all_combinations
    from .vae import STATS_IMAGES, to_pixels

    torch.manual_seed(seed)
    vae = AutoencoderKLQwenImage(**QWEN_VAE)
    combos = all_combinations()
    rng = np.random.default_rng(seed)
    n = settings.vae_images
    data = to_pixels(
        render_batch([combos[i] for i in rng.integers(0, len(combos), n)], seed=seed + 1)
    )
    data = data.unsqueeze(2)  # [N, 3, 1, H, W]
    opt = torch.optim.AdamW(vae.parameters(), lr=1e-3)
    bar = tqdm(range(settings.vae_steps), desc="vae", disable=not progress)
    for _ in bar:
        x = data[torch.from_numpy(rng.integers(0, n, settings.vae_batch))]
        post = vae.encode(x).latent_dist
        recon = vae.decode(post.sample()).sample
        mse = torch.mean((recon - x) ** 2)
        loss = mse + 1e-6 * post.kl().mean() / post.mean[0].numel()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        bar.set_postfix(mse=f"{mse.item():.4f}")
    vae.eval()
    with torch.no_grad():
        z = torch.cat(
            [
                vae.encode(data[i : i + 256]).latent_dist.mode()
                for i in range(0, min(n, STATS_IMAGES), 256)
            ]
        )
    dims = (0, 2, 3, 4)
    vae.register_to_config(
        latents_mean=z.mean(dim=dims).tolist(), latents_std=z.std(dim=dims).tolist()
    )
    return vae


@torch.no_grad()
def family_latents(comps, images: np.ndarray, batch: int = 256) -> torch.Tensor:
    """The engine's latents of uint8 images in the family's layout: SD3's scaled
    [N, 16, h, w]; Qwen-Image's (z − mean)/std per channel, packed into 2x2 tokens."""
    if "temperal_downsample" not in comps.vae.config:  # SD3's AutoencoderKL
        return encode_images(comps.vae, images, batch)
    from ..common.families.flux import pack_latents
    from .vae import to_pixels

    config = comps.vae.config
    mean = torch.tensor(config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(config.latents_std).view(1, -1, 1, 1, 1)
    out = []
    for lo in range(0, images.shape[0], batch):
        z = comps.vae.encode(to_pixels(images[lo : lo + batch]).unsqueeze(2)).latent_dist.mode()
        out.append(pack_latents(((z - mean) / std)[:, :, 0]))
    return torch.cat(out)


def train_family_flow(
    comps,
    encoders: list[torch.nn.Module],
    train_specs: list[ShapeSpec],
    settings: PretrainSettings,
    *,
    seed: int,
    empty_prompt: str,
    lr: float = 1e-3,
    progress: bool = True,
) -> float:
    """``world/flow.flow_matching`` through ``comps``'s velocity adapter and prompt
    encoding; returns the loss's moving average."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(train_specs), settings.flow_images)
    images = render_batch([train_specs[i] for i in idx], seed=seed + 2)
    latents = family_latents(comps, images)
    prompts = [train_specs[i].prompt for i in idx]
    ema = flow_matching(
        comps.velocity_model(IMAGE_SIZE, IMAGE_SIZE, guidance=1.0),
        lambda texts: comps.encode_prompts(texts, MAX_TOKENS),
        latents,
        prompts,
        [comps.transformer, *encoders],
        steps=settings.flow_steps,
        batch=settings.flow_batch,
        decay_steps=settings.flow_decay_steps,
        lr=lr,
        rng=rng,
        empty_prompt=empty_prompt,
        empty_prompt_rate=EMPTY_PROMPT_RATE,
        progress=progress,
    )
    comps.for_inference()
    return ema


def pretrain_family(
    out: str | Path,
    family: str,
    *,
    quick: bool = False,
    seed: int = 0,
    flux_world: str | Path = DEFAULT_WORLD,
    progress: bool = True,
) -> dict:
    """Train and save the shapes world in ``family``'s layout under ``out``."""
    from .sd3_random import save_sd3_pipeline

    if family not in FAMILIES:
        raise UsageError(f"--family {family!r}: choose from flux, {', '.join(FAMILIES)}")
    out, flux_world = Path(out), Path(flux_world)
    if (out / "pipeline").exists():
        raise UsageError(f"{out / 'pipeline'} already exists; choose another --out")
    settings = QUICK if quick else FULL
    start = time.perf_counter()
    train, held = split_combinations()
    if family == "sd3":
        comps, text = _sd3_components(flux_world, seed)
        encoders = [text["text_encoder"], text["text_encoder_2"], text["text_encoder_3"]]
        empty, vae_from = "", f"{flux_world / 'pipeline' / 'vae'} (the FLUX world's, reused)"
    else:
        from ..common.families.qwenimage_pipeline import NEGATIVE_PROMPT

        comps, encoders = _qwenimage_components(settings, seed, progress)
        empty, vae_from = NEGATIVE_PROMPT, f"trained here: AutoencoderKLQwenImage {QWEN_VAE}"
    vae_s = time.perf_counter() - start
    loss = train_family_flow(
        comps, encoders, train, settings, seed=seed, empty_prompt=empty, progress=progress
    )
    flow_s = time.perf_counter() - start - vae_s
    if family == "sd3":
        save_sd3_pipeline(out / "pipeline", comps.transformer, comps.vae, text)
    else:
        from .qwenimage_random import save_qwenimage_pipeline

        save_qwenimage_pipeline(
            out / "pipeline", comps.transformer, comps.vae, comps.text_encoder, comps.tokenizer
        )
    shutil.copytree(flux_world / "shapes_clip", out / "shapes_clip")
    meta = {
        "command": "g2rpo pretrain " + " ".join(sys.argv[2:])
        if sys.argv[1:2] == ["pretrain"]
        else f"g2rpo pretrain --family {family} --out {out}{' --quick' if quick else ''}",
        "family": family,
        "seed": seed,
        "quick": quick,
        "settings": asdict(settings),
        "vae": vae_from,
        "empty_prompt_rate": EMPTY_PROMPT_RATE,
        "split": {"seed": SPLIT_SEED, "held_out": [s.prompt for s in held]},
        "flow_loss_ema": loss,
        "timings": {"vae_s": round(vae_s, 1), "flow_s": round(flow_s, 1)},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    (out / "world.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta
