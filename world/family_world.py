"""``g2rpo pretrain --family sd3``: the shapes world in StableDiffusion3Pipeline's layout,
trained by the FLUX world's objective.

The FLUX world's trained VAE is reused as it is (SD3's VAE is the same AutoencoderKL
class, 16 latent channels, (z − shift)·scale), so both worlds see the same latents; an
MMDiT transformer and SD3's three text encoders (``world/sd3_random.py``'s CLIP-L,
CLIP-G and T5) are trained together on the training split with the rectified-flow loss
through the family's own velocity adapter and prompt encoding, exactly as the rollout
calls them. One prompt in ten is replaced by the empty prompt, as SD3 was trained, so
that the classifier-free guidance the family samples with has an unconditional model
to extrapolate from. ``shapes_clip`` is copied from the FLUX world (a reward does not
depend on the policy's layout).

OUT/pipeline/      StableDiffusion3Pipeline directory
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
from ..common.shapes import SPLIT_SEED, ShapeSpec, render_batch, split_combinations
from .flow import lr_at
from .pretrain import FULL, QUICK, PretrainSettings
from .text import MAX_TOKENS
from .vae import encode_images

FAMILIES = ("sd3",)
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

    from ..common.sd3_pipeline import SD3Components
    from .sd3_random import sd3_text_stack

    torch.manual_seed(seed)
    vae = AutoencoderKL.from_pretrained(flux_world / "pipeline" / "vae", local_files_only=True)
    text = sd3_text_stack(clip_tokens=MAX_TOKENS)
    transformer = SD3Transformer2DModel(**sd3_transformer_config())
    return SD3Components(transformer=transformer, vae=vae.eval(), **text), text


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
    """x_t = (1−t)·x0 + t·ε, target ε − x0, t ~ sigmoid(N(0,1)), as ``world/flow.py``,
    through ``comps``'s velocity adapter (unguided) and prompt encoding (with gradients);
    returns the loss's moving average."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(train_specs), settings.flow_images)
    images = render_batch([train_specs[i] for i in idx], seed=seed + 2)
    with torch.no_grad():
        latents = encode_images(comps.vae, images)  # [N, 16, h, w], SD3's own layout
    prompts = [train_specs[i].prompt for i in idx]
    velocity = comps.velocity_model(IMAGE_SIZE, IMAGE_SIZE, guidance=1.0)
    modules = [comps.transformer, *encoders]
    for m in modules:
        m.train().requires_grad_(True)
    params = [p for m in modules for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.99))
    steps, batch = settings.flow_steps, settings.flow_batch
    warmup = 200 if steps > 400 else steps // 10 + 1
    ema = None
    bar = tqdm(range(steps), desc="flow", disable=not progress)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, warmup, settings.flow_decay_steps, lr)
        pick = rng.integers(0, len(prompts), batch)
        x0 = latents[torch.from_numpy(pick)]
        noise = torch.randn_like(x0)
        t = torch.sigmoid(torch.randn(batch))
        xt = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * noise
        texts = [empty_prompt if rng.random() < EMPTY_PROMPT_RATE else prompts[i] for i in pick]
        pred = velocity(xt, t, comps.encode_prompts(texts, MAX_TOKENS))
        loss = torch.mean((pred - (noise - x0)) ** 2)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        bar.set_postfix(loss=f"{ema:.4f}")
    comps.for_inference()
    return float(ema)


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
    comps, text = _sd3_components(flux_world, seed)
    encoders = [text["text_encoder"], text["text_encoder_2"], text["text_encoder_3"]]
    loss = train_family_flow(
        comps, encoders, train, settings, seed=seed, empty_prompt="", progress=progress
    )
    flow_s = time.perf_counter() - start
    save_sd3_pipeline(out / "pipeline", comps.transformer, comps.vae, text)
    shutil.copytree(flux_world / "shapes_clip", out / "shapes_clip")
    meta = {
        "command": "g2rpo pretrain " + " ".join(sys.argv[2:])
        if sys.argv[1:2] == ["pretrain"]
        else f"g2rpo pretrain --family {family} --out {out}{' --quick' if quick else ''}",
        "family": family,
        "seed": seed,
        "quick": quick,
        "settings": asdict(settings),
        "vae": f"{flux_world / 'pipeline' / 'vae'} (the FLUX world's, reused)",
        "empty_prompt_rate": EMPTY_PROMPT_RATE,
        "split": {"seed": SPLIT_SEED, "held_out": [s.prompt for s in held]},
        "flow_loss_ema": loss,
        "timings": {"flow_s": round(flow_s, 1)},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    (out / "world.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta
