"""Model architectures shipped with g2rpo: the exact ``config.json`` of each
component of a pipeline, so a plan (or ``g2rpo doctor --random-weights``) can build
FLUX.1-dev on the meta device without downloading it."""

from __future__ import annotations

import json
from importlib import resources

PRESETS = ("flux1-dev",)
COMPONENTS = ("transformer", "vae", "text_encoder", "text_encoder_2")


def preset_config(name: str, component: str) -> dict:
    """The ``config.json`` of ``component`` of pipeline preset ``name`` (a fresh dict)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
    if component not in COMPONENTS:
        known = ", ".join(COMPONENTS)
        raise ValueError(f"unknown pipeline component {component!r}; known: {known}")
    text = resources.files(__package__).joinpath("presets", name, f"{component}.json").read_text()
    return json.loads(text)


def build_component(component: str, config: dict):
    """A randomly initialised pipeline component from its ``config.json``, on the
    current default device and dtype (callers wrap it in ``torch.device("meta")``,
    a GPU, or a default dtype)."""
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    arch = {k: v for k, v in config.items() if not k.startswith("_")}
    if component == "transformer":
        return FluxTransformer2DModel.from_config(arch)
    if component == "vae":
        return AutoencoderKL.from_config(arch)
    if component == "text_encoder":
        return CLIPTextModel(CLIPTextConfig.from_dict(config))
    if component == "text_encoder_2":
        return T5EncoderModel(T5Config.from_dict(config))
    raise ValueError(f"unknown pipeline component {component!r}; known: {', '.join(COMPONENTS)}")
