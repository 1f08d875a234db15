"""The model a plan is for: each component's config.json (from ``model.pretrained``, or
a preset named by its path), the parameter counts built from them on the meta device,
and the trace-shape terms they decide (family, guidance, text rows, latent size).
planning/estimate.py turns them into each actor's memory."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..common.config.run import G2RPOConfig
from ..common.families.velocity import uses_cfg
from ..common.paths import resolve_path
from .presets import (
    FAMILY_COMPONENTS,
    PRESET_FAMILY,
    build_component,
    preset_config,
    transformer_family,
)
from .trace import SD3_CLIP_TOKENS, cached

# the preset planned for a model.pretrained that is not here, by what its path names
PATH_PRESETS = (
    ("stable-diffusion-3.5", "sd35-medium"),
    ("sd3.5", "sd35-medium"),
    ("qwen-image", "qwen-image"),
    ("qwen_image", "qwen-image"),
)


def architecture(cfg: G2RPOConfig) -> tuple[dict[str, dict], str]:
    """The config.json of each component: from ``model.pretrained`` when that
    directory is here, else a preset: SD3.5-Medium's or Qwen-Image's when the path
    names it (/models/stable-diffusion-3.5-medium, /models/Qwen-Image), else FLUX.1-dev's
    (a cluster path is usually absent where one plans)."""
    if cfg.model.pretrained is not None:
        root = Path(resolve_path(cfg.model.pretrained))
        kind = "flux"  # component configs alone (no model_index.json) are read as FLUX's
        if (root / "model_index.json").is_file():
            from ..common.families.registry import family_of

            kind = family_of(root)
        names = FAMILY_COMPONENTS[kind]
        if all((root / n / "config.json").is_file() for n in names):
            return {n: json.loads((root / n / "config.json").read_text()) for n in names}, (
                str(root)
            )
    where = cfg.model.pretrained or "none"
    lowered = where.lower()
    name = next((p for key, p in PATH_PRESETS if key in lowered), "flux1-dev")
    names = FAMILY_COMPONENTS[PRESET_FAMILY[name]]
    return {n: preset_config(name, n) for n in names}, (
        f"preset {name} (model.pretrained {where} not found here)"
    )


def family(archs: dict) -> str:
    return transformer_family(archs["transformer"])


def guided(cfg: G2RPOConfig, archs: dict) -> dict:
    """The trace shape's guidance term: SD3 and Qwen-Image with classifier-free guidance
    run the negative prompt beside each sample; FLUX's guidance is an embedding (no key,
    so FLUX's traces keep their cache keys)."""
    if family(archs) in ("sd3", "qwenimage") and uses_cfg(cfg.model.guidance):
        return {"guided": True}
    return {}


def text_tokens(cfg: G2RPOConfig, archs: dict) -> int:
    """Rows of a prompt's text sequence: T5's, after SD3's 77 CLIP rows."""
    extra = SD3_CLIP_TOKENS if family(archs) == "sd3" else 0
    return cfg.train.max_sequence_length + extra


def latent_elements(archs: dict, hw: tuple[int, int]) -> int:
    """Numbers in one latent: FLUX's (and Qwen-Image's) packed tokens x 4·C, or SD3's
    C x h x w."""
    tr = archs["transformer"]
    if family(archs) == "sd3":
        return tr["in_channels"] * hw[0] * hw[1]
    return (hw[0] // 2) * (hw[1] // 2) * tr["in_channels"]


def _build_meta(component: str, config: dict) -> torch.nn.Module:
    with torch.device("meta"):
        return build_component(component, config)


def parameter_counts(component: str, config: dict, lora: dict | None = None) -> dict:
    """{"total", "largest_block", "linear", "adapters"} parameters of a component."""

    def compute() -> dict:
        module = _build_meta(component, config)
        out = {"total": sum(p.numel() for p in module.parameters()), "adapters": 0}
        # persistent buffers ship with the weights (SD3's 384² positional table: 226M)
        out["buffers"] = sum(b.numel() for b in module.buffers())
        blocks = [
            b
            for name in ("transformer_blocks", "single_transformer_blocks")
            for b in getattr(module, name, [])
        ]
        out["largest_block"] = max(
            (sum(p.numel() for p in b.parameters()) for b in blocks), default=0
        )
        if lora is not None:
            from ..common.config.model import LoraOptions
            from ..common.families.lora import add_lora

            add_lora(module, LoraOptions(**lora), 0)
            out["adapters"] = sum(p.numel() for p in module.parameters()) - out["total"]
        return out

    return cached("params", {"component": component, "config": config, "lora": lora}, compute)
