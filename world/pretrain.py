"""``g2rpo pretrain``: build the whole offline world in the standard layouts.

OUT/pipeline/      FluxPipeline directory (transformer, vae, text_encoder(+_2),
                   tokenizer(+_2), scheduler, model_index.json)
OUT/shapes_clip/   the in-domain reward (CLIPModel + CLIPProcessor)
OUT/world.json     seed, command, settings, split, timings
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..common.errors import UsageError
from ..common.prompts.shapes import SPLIT_SEED, split_combinations
from .clip_reward import build_processor, train_clip_reward
from .flow import train_flow
from .text import build_clip_tokenizer, build_t5_tokenizer, build_text_encoders
from .vae import train_vae


@dataclass(frozen=True)
class PretrainSettings:
    vae_steps: int
    vae_images: int
    flow_steps: int
    flow_decay_steps: int
    flow_images: int
    clip_steps: int
    vae_batch: int = 64
    flow_batch: int = 128
    clip_batch: int = 128


FULL = PretrainSettings(
    vae_steps=500,
    vae_images=20_000,
    flow_steps=2000,
    flow_decay_steps=600,
    flow_images=40_000,
    clip_steps=600,
)
# the layout and code paths of a world in seconds, not its quality (tests): its
# VAE's latent statistics are taken over its 128 images (a full world's over 2,048), and
# its small batches keep each step cheap (the full batches made 8 flow steps most of the
# quick world's 50 s in CI)
QUICK = PretrainSettings(
    vae_steps=4,
    vae_images=128,
    flow_steps=8,
    flow_decay_steps=3,
    flow_images=64,
    clip_steps=4,
    vae_batch=16,
    flow_batch=16,
    clip_batch=32,
)


def pretrain(out: str | Path, *, quick: bool = False, seed: int = 0, progress: bool = True) -> dict:
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    out = Path(out)
    if (out / "pipeline").exists():
        raise UsageError(f"{out / 'pipeline'} already exists; choose another --out")
    settings = QUICK if quick else FULL
    timings: dict[str, float] = {}
    start = time.perf_counter()
    train, held = split_combinations()
    tok, tok2 = build_clip_tokenizer(), build_t5_tokenizer()
    clip_text, t5 = build_text_encoders(len(tok), len(tok2), seed=seed)

    t = time.perf_counter()
    vae = train_vae(
        settings.vae_steps,
        seed,
        num_images=settings.vae_images,
        batch=settings.vae_batch,
        progress=progress,
    )
    timings["vae_s"] = time.perf_counter() - t

    t = time.perf_counter()
    transformer, flow_loss = train_flow(
        vae,
        (tok, tok2),
        (clip_text, t5),
        train,
        steps=settings.flow_steps,
        decay_steps=settings.flow_decay_steps,
        seed=seed,
        num_images=settings.flow_images,
        batch=settings.flow_batch,
        progress=progress,
    )
    timings["flow_s"] = time.perf_counter() - t

    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=False)
    pipe = FluxPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=clip_text,
        tokenizer=tok,
        text_encoder_2=t5,
        tokenizer_2=tok2,
        transformer=transformer,
    )
    pipe.save_pretrained(out / "pipeline")

    t = time.perf_counter()
    reward = train_clip_reward(
        tok, steps=settings.clip_steps, seed=seed, batch=settings.clip_batch, progress=progress
    )
    reward.save_pretrained(out / "shapes_clip")
    build_processor(tok).save_pretrained(out / "shapes_clip")
    timings["shapes_clip_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - start

    meta = {
        "command": "g2rpo pretrain " + " ".join(sys.argv[2:])
        if sys.argv[1:2] == ["pretrain"]
        else f"g2rpo pretrain --out {out}{' --quick' if quick else ''} --seed {seed}",
        "seed": seed,
        "quick": quick,
        "settings": asdict(settings),
        "split": {"seed": SPLIT_SEED, "held_out": [s.prompt for s in held]},
        "flow_loss_ema": flow_loss,
        "timings": {k: round(v, 1) for k, v in timings.items()},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    (out / "world.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta
