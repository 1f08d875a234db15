"""A pipeline directory with random weights in a known architecture, for
``g2rpo doctor --random-weights`` on a node that has no checkpoint yet.

The architecture comes from a shipped preset (``flux1-dev``, ``sd35-medium``,
``qwen-image``) or from an existing
pipeline directory (``tiny``: the committed shapes world's); ``blocks`` keeps the
transformer's width but fewer blocks (FLUX width, few blocks). Tokenizers and the
scheduler are copied from the committed world: its word-level tokenizers give ids
that fit any vocabulary, which random text encoders need no more than that."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from ..common.errors import UsageError
from ..common.paths import DEFAULT_WORLD
from .presets import (
    COMPONENTS,
    FAMILY_COMPONENTS,
    PRESET_FAMILY,
    PRESETS,
    build_component,
    preset_config,
)
from .trace import default_dtype

WORLD_PIPELINE = DEFAULT_WORLD / "pipeline"
RANDOM_ARCHITECTURES = ("tiny", *PRESETS)


def architecture_configs(name: str) -> dict[str, dict]:
    """config.json of each model component of architecture ``name``."""
    if name in PRESETS:
        return {c: preset_config(name, c) for c in FAMILY_COMPONENTS[PRESET_FAMILY[name]]}
    if name == "tiny":
        root = WORLD_PIPELINE
        return {c: json.loads((root / c / "config.json").read_text()) for c in COMPONENTS}
    raise UsageError(f"--random-weights {name!r}: choose from {', '.join(RANDOM_ARCHITECTURES)}")


def _build(component: str, config: dict, device: str, dtype: torch.dtype):
    # initialised where it will run (fast on a GPU) and in its dtype: FLUX.1-dev's
    # transformer in float32 alone would take 48 GB before a bf16 copy
    with torch.device(device), default_dtype(dtype):
        return build_component(component, config)


def build_random_pipeline(
    out: str | Path,
    name: str,
    *,
    blocks: tuple[int, int] | None = None,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
) -> Path:
    """Write a random-weight FluxPipeline of architecture ``name`` to ``out``
    (``blocks``: (double, single) transformer blocks instead of the preset's); the
    transformer and text encoders are saved in ``dtype``, the VAE in float32."""
    configs = architecture_configs(name)
    family = PRESET_FAMILY.get(name, "flux")
    one_kind = family in ("sd3", "qwenimage")  # MMDiT layers only, no single-stream blocks
    if blocks is not None:
        double, single = blocks
        if (
            double < 0
            or single < 0
            or double + single == 0
            or (one_kind and (single or not double))
        ):
            need = (
                "LAYERS,0 for SD3 and Qwen-Image"
                if one_kind
                else "0 or more each and one block at least"
            )
            raise UsageError(f"--blocks {double},{single}: needs {need}")
        depth = {"num_layers": double}
        if family == "sd3":  # SD3.5's dual-attention layers among the ones kept
            dual = configs["transformer"].get("dual_attention_layers") or []
            depth["dual_attention_layers"] = [i for i in dual if i < double]
        elif family == "flux":
            depth["num_single_layers"] = single
        configs["transformer"] = {**configs["transformer"], **depth}
    if family == "sd3":
        return _save_sd3(Path(out), configs, dtype, device, seed)
    if family == "qwenimage":
        return _save_qwenimage(Path(out), configs, dtype, device, seed)
    out = Path(out)
    world = WORLD_PIPELINE
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(world / "model_index.json", out / "model_index.json")
    for sub in ("scheduler", "tokenizer", "tokenizer_2"):
        shutil.copytree(world / sub, out / sub, dirs_exist_ok=True)
    torch.manual_seed(seed)
    for component in COMPONENTS:
        model = _build(
            component, configs[component], device, torch.float32 if component == "vae" else dtype
        )
        model.save_pretrained(out / component)
        del model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return out


def _save_sd3(out: Path, configs: dict, dtype: torch.dtype, device: str, seed: int) -> Path:
    """A random StableDiffusion3Pipeline: the built components, the world's word-level
    tokenizers (CLIP's for CLIP-L and CLIP-G, T5's), SD3's static-shift scheduler."""
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline
    from transformers import AutoTokenizer

    torch.manual_seed(seed)
    parts = {
        c: _build(c, configs[c], device, torch.float32 if c == "vae" else dtype) for c in configs
    }
    clip = AutoTokenizer.from_pretrained(WORLD_PIPELINE / "tokenizer", local_files_only=True)
    t5 = AutoTokenizer.from_pretrained(WORLD_PIPELINE / "tokenizer_2", local_files_only=True)
    pipe = StableDiffusion3Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        tokenizer=clip,
        tokenizer_2=clip,
        tokenizer_3=t5,
        **parts,
    )
    pipe.save_pretrained(out)
    return out


def _save_qwenimage(out: Path, configs: dict, dtype: torch.dtype, device: str, seed: int) -> Path:
    """A random QwenImagePipeline: the built components, the Qwen-Image test model's
    byte-level tokenizer (``world/qwenimage_random.py``: its ids fit any vocabulary),
    Qwen-Image's resolution-shifted scheduler."""
    from ..world.qwenimage_random import build_qwen_tokenizer, save_qwenimage_pipeline

    torch.manual_seed(seed)
    parts = {
        c: _build(c, configs[c], device, torch.float32 if c == "vae" else dtype) for c in configs
    }
    return save_qwenimage_pipeline(out, tokenizer=build_qwen_tokenizer(), **parts)


def text_stack_qwenimage_pipeline(out: Path, transformer: dict, vae: dict, seed: int = 0) -> Path:
    """A Qwen-Image pipeline of ``transformer`` and ``vae`` configs on the Qwen-Image test
    model's text stack (``world/qwenimage_random.py``: its width replaces the config's
    joint_attention_dim; ``g2rpo rehearse``'s Qwen-Image model)."""
    from diffusers import QwenImageTransformer2DModel

    from ..world.qwenimage_random import (
        build_qwen_text_encoder,
        build_qwen_tokenizer,
        save_qwenimage_pipeline,
    )

    torch.manual_seed(seed)
    tokenizer = build_qwen_tokenizer()
    text_encoder = build_qwen_text_encoder(len(tokenizer))
    arch = {k: v for k, v in transformer.items() if not k.startswith("_")}
    arch["joint_attention_dim"] = text_encoder.config.text_config.hidden_size
    model = QwenImageTransformer2DModel.from_config(arch)
    return save_qwenimage_pipeline(out, model, build_component("vae", vae), text_encoder, tokenizer)


def text_stack_sd3_pipeline(out: Path, transformer: dict, vae: dict, seed: int = 0) -> Path:
    """An SD3 pipeline of ``transformer`` and ``vae`` configs on the shapes world's SD3
    text stack (``world/sd3_random.py``: its widths replace the configs' text widths),
    CLIP's context 77 tokens long as SD3.5's (``g2rpo rehearse``'s SD3 model)."""
    from diffusers import SD3Transformer2DModel

    from ..world.sd3_random import POOLED_DIM, T5_DIM, save_sd3_pipeline, sd3_text_stack

    torch.manual_seed(seed)
    text = sd3_text_stack(clip_tokens=77)
    arch = {k: v for k, v in transformer.items() if not k.startswith("_")}
    arch.update(joint_attention_dim=T5_DIM, pooled_projection_dim=POOLED_DIM)
    model = SD3Transformer2DModel.from_config(arch)
    return save_sd3_pipeline(out, model, build_component("vae", vae), text)
