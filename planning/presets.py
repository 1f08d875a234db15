"""Model architectures shipped with g2rpo: the exact ``config.json`` of each
component of a pipeline, so a plan (or ``g2rpo doctor --random-weights``) can build
FLUX.1-dev, SD3.5-Medium or Qwen-Image on the meta device without downloading it."""

from __future__ import annotations

import json
from importlib import resources

PRESETS = ("flux1-dev", "sd35-medium", "qwen-image")
FAMILY_COMPONENTS = {  # the model components of each family's pipeline directory
    "flux": ("transformer", "vae", "text_encoder", "text_encoder_2"),
    "sd3": ("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"),
    "qwenimage": ("transformer", "vae", "text_encoder"),
}
PRESET_FAMILY = {"flux1-dev": "flux", "sd35-medium": "sd3", "qwen-image": "qwenimage"}
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
    """'sd3' for an SD3Transformer2DModel config (MMDiT: a caption projection), 'flux'
    for a FluxTransformer2DModel's (single-stream blocks), else 'qwenimage'. Read from
    the keys, as a plan's cached traces key on them without the ``_class_name``."""
    if "caption_projection_dim" in config:
        return "sd3"
    return "flux" if "num_single_layers" in config else "qwenimage"


def build_component(component: str, config: dict):
    """A randomly initialised pipeline component from its ``config.json``, on the
    current default device and dtype (callers wrap it in ``torch.device("meta")``,
    a GPU, or a default dtype). Which class is read from the config itself: a
    transformer by its family, a text encoder by its model type (T5, or CLIP with or
    without SD3's projection)."""
    from diffusers import (
        AutoencoderKL,
        AutoencoderKLQwenImage,
        FluxTransformer2DModel,
        QwenImageTransformer2DModel,
        SD3Transformer2DModel,
    )
    from transformers import (
        CLIPTextConfig,
        CLIPTextModel,
        CLIPTextModelWithProjection,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        T5Config,
        T5EncoderModel,
    )

    arch = {k: v for k, v in config.items() if not k.startswith("_")}
    if component == "transformer":
        kind = {
            "sd3": SD3Transformer2DModel,
            "flux": FluxTransformer2DModel,
            "qwenimage": QwenImageTransformer2DModel,
        }[transformer_family(arch)]
        return kind.from_config(arch)
    if component == "vae":
        if "temperal_downsample" in arch:  # Qwen-Image's 3-D VAE
            return AutoencoderKLQwenImage.from_config(arch)
        return AutoencoderKL.from_config(arch)
    if component.startswith("text_encoder"):
        if config.get("model_type") == "t5":
            return T5EncoderModel(T5Config.from_dict(config))
        if config.get("model_type") == "qwen2_5_vl":
            return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig.from_dict(config))
        projected = any("WithProjection" in a for a in config.get("architectures") or [])
        kind = CLIPTextModelWithProjection if projected else CLIPTextModel
        return kind(CLIPTextConfig.from_dict(config))
    raise ValueError(f"unknown pipeline component {component!r}")
