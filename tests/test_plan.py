"""The memory plan: FLUX.1-dev presets, estimates held against traced peaks, the CLI."""

from __future__ import annotations

import pytest
import torch
from g2rpo.planning.presets import COMPONENTS, PRESETS, preset_config

# Parameter counts of FLUX.1-dev's components (the published checkpoints' sizes).
FLUX1_DEV_PARAMS = {
    "transformer": 11.90e9,
    "text_encoder_2": 4.76e9,
    "text_encoder": 123.1e6,
    "vae": 83.8e6,
}


def build_on_meta(component: str, config: dict) -> torch.nn.Module:
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    with torch.device("meta"):
        if component == "transformer":
            return FluxTransformer2DModel.from_config(config)
        if component == "vae":
            return AutoencoderKL.from_config(config)
        if component == "text_encoder":
            return CLIPTextModel(CLIPTextConfig.from_dict(config))
        return T5EncoderModel(T5Config.from_dict(config))


@pytest.mark.parametrize("component", COMPONENTS)
def test_flux1_dev_preset_builds_with_published_size(component):
    assert PRESETS == ("flux1-dev",)
    module = build_on_meta(component, preset_config("flux1-dev", component))
    params = sum(p.numel() for p in module.parameters())
    assert params == pytest.approx(FLUX1_DEV_PARAMS[component], rel=0.005)


def test_preset_errors_name_the_choices():
    with pytest.raises(ValueError, match="flux1-dev"):
        preset_config("flux2", "vae")
    with pytest.raises(ValueError, match="text_encoder_2"):
        preset_config("flux1-dev", "unet")
