"""Model architectures shipped with g2rpo: the exact ``config.json`` of each
component of a pipeline, so a plan (or ``g2rpo doctor --random-weights``) can build
FLUX.1-dev or SD3.5-Medium on the meta device without downloading it."""

from __future__ import annotations

import json
from importlib import resources

PRESETS = ("flux1-dev", "sd35-medium")
FAMILY_COMPONENTS = {  # the model components of each family's pipeline directory
    "flux": ("transformer", "vae", "text_encoder", "text_encoder_2"),
    "sd3": ("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"),
}
PRESET_FAMILY = {"flux1-dev": "flux", "sd35-medium": "sd3"}
COMPONENTS = FAMILY_COMPONENTS["flux"]  # FLUX's, the components every family has first


def preset_config(name: str, component: str) -> dict:
    """The ``config.json`` of ``component`` of pipeline preset ``name`` (a fresh dict)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
    known = FAMILY_COMPONENTS[PRESET_FAMILY[name]]
    if component not in known:
        raise ValueError(f"unknown pipeline component {component!r}; known: {', '.join(known)}")
    text = resources.files(__package__).joinpath("presets", name, f"{component}.json").read_text()
    return json.loads(text)


def transformer_family(config: dict) -> str:
    """'sd3' for an SD3Transformer2DModel config (MMDiT: a caption projection), else
    'flux'. Read from the keys, as a plan's cached traces key on them without the
    ``_class_name``."""
    return "sd3" if "caption_projection_dim" in config else "flux"


def build_component(component: str, config: dict):
    """A randomly initialised pipeline component from its ``config.json``, on the
    current default device and dtype (callers wrap it in ``torch.device("meta")``,
    a GPU, or a default dtype). Which class is read from the config itself: a
    transformer by its family, a text encoder by its model type (T5, or CLIP with or
    without SD3's projection)."""
    from diffusers import AutoencoderKL, FluxTransformer2DModel, SD3Transformer2DModel
    from transformers import (
        CLIPTextConfig,
        CLIPTextModel,
        CLIPTextModelWithProjection,
        T5Config,
        T5EncoderModel,
    )

    arch = {k: v for k, v in config.items() if not k.startswith("_")}
    if component == "transformer":
        family = transformer_family(arch)
        return (SD3Transformer2DModel if family == "sd3" else FluxTransformer2DModel).from_config(
            arch
        )
    if component == "vae":
        return AutoencoderKL.from_config(arch)
    if component.startswith("text_encoder"):
        if config.get("model_type") == "t5":
            return T5EncoderModel(T5Config.from_dict(config))
        projected = any("WithProjection" in a for a in config.get("architectures") or [])
        kind = CLIPTextModelWithProjection if projected else CLIPTextModel
        return kind(CLIPTextConfig.from_dict(config))
    raise ValueError(f"unknown pipeline component {component!r}")
