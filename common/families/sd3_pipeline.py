"""A Stable Diffusion 3 pipeline directory (diffusers layout: SD3.5-Medium's) loaded
for rollouts, with the same interface as ``FluxComponents`` (``families.py``).

What differs from FLUX, each as diffusers' ``StableDiffusion3Pipeline`` does it:

* **Latents** stay [B, C, H, W]: the transformer patches them itself, so the engine's
  sample shape is (C, h, w), not FLUX's packed tokens.
* **Prompts** go through three encoders: CLIP-L and CLIP-G (each its penultimate hidden
  state; their projected pooled outputs concatenated, 768 + 1280 = 2048), the CLIP states
  concatenated on channels and zero-padded to T5's width, then T5's states appended on
  the sequence: [B, 77 + max_sequence_length, 4096].
* **Guidance** is classifier-free: each model call runs the prompt and the empty
  prompt's embeddings together and returns v_u + s·(v_c − v_u). That guided velocity is
  what the SDE step, its log-prob and the learner's ratio all see (Flow-GRPO's SD3 code
  computes its log-probs from the guided prediction in sampling and training alike);
  it doubles every model call's FLOPs. ``guidance`` ≤ 1 calls the model once.
* **Timesteps**: the transformer takes 1000·σ (FLUX's scales σ by 1000 inside).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from .components import FamilyComponents
from .flux_pipeline import decode_latents, vae_scale_factor
from .velocity import GuidedVelocity

COMPONENTS = (
    "transformer",
    "vae",
    "text_encoder",
    "text_encoder_2",
    "text_encoder_3",
    "tokenizer",
    "tokenizer_2",
    "tokenizer_3",
)


class SD3Velocity(GuidedVelocity):
    """Adapts an SD3Transformer2DModel to the engine's VelocityModel protocol, with
    classifier-free guidance of scale ``guidance``: v_u + s·(v_c − v_u). cond holds
    ``encoder_hidden_states``, ``pooled_projections`` and, for guidance, their
    ``negative_`` twins."""

    NEGATIVE_FIRST = True  # the empty prompt's rows first, as diffusers orders them

    def __init__(
        self,
        transformer: Any,
        guidance: float = 4.5,
        autocast_dtype: torch.dtype | None = None,
        attention_backend: str = "auto",
    ) -> None:
        super().__init__(transformer, guidance, autocast_dtype, attention_backend)

    def text_inputs(self, cond: Mapping[str, torch.Tensor], prefix: str) -> dict:
        return {k: cond[prefix + k] for k in ("encoder_hidden_states", "pooled_projections")}

    def model_timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        return sigma * 1000.0

    def transformer_inputs(self, x: torch.Tensor, t: torch.Tensor, text: dict) -> dict:
        device, f32 = self.device, torch.float32
        return dict(
            hidden_states=x,
            timestep=t,
            encoder_hidden_states=text["encoder_hidden_states"].to(device, f32),
            pooled_projections=text["pooled_projections"].to(device, f32),
        )

    def combine(self, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        return negative + self.guidance * (positive - negative)


@dataclass
class SD3Components(FamilyComponents):
    """The SD3 family (``families.py``): StableDiffusion3Pipeline's components."""

    PIPELINE = "StableDiffusion3Pipeline"
    LABEL = "SD3 pipeline"
    COMPONENTS = COMPONENTS
    # as StableDiffusion3Pipeline samples: SD3.5-Medium's guidance (its model card), the
    # scheduler's own σ grid and 1000·σ fed as a float (a uniform grid had been 14/255
    # away from the pipeline's images on the committed SD3 world)
    SAMPLING: ClassVar[dict] = {
        "guidance": 4.5,
        "sigma_grid": "diffusers",
        "quantize_timestep": False,
    }
    NEGATIVE_PROMPT = ""  # the pipeline's default negative prompt

    transformer: Any
    vae: Any
    text_encoder: Any
    text_encoder_2: Any
    text_encoder_3: Any
    tokenizer: Any
    tokenizer_2: Any
    tokenizer_3: Any
    path: Path | None = None
    guidance: float = SAMPLING["guidance"]  # the CFG scale encode_prompts prepares for

    @staticmethod
    def transformer_class():
        from diffusers import SD3Transformer2DModel

        return SD3Transformer2DModel

    @staticmethod
    def module_classes() -> dict[str, Any]:
        from diffusers import AutoencoderKL
        from transformers import CLIPTextModelWithProjection, T5EncoderModel

        return {
            "vae": AutoencoderKL,
            "text_encoder": CLIPTextModelWithProjection,
            "text_encoder_2": CLIPTextModelWithProjection,
            "text_encoder_3": T5EncoderModel,
        }

    @staticmethod
    def velocity(
        transformer, latent_hw: tuple[int, int], guidance, autocast_dtype, attention_backend
    ) -> SD3Velocity:
        """The family's velocity adapter over a transformer (the learner's own); SD3's
        transformer patches the latent itself, so the size is not needed."""
        return SD3Velocity(transformer, guidance, autocast_dtype, attention_backend)

    def latent_size(self, height: int, width: int) -> tuple[int, int]:
        """Latent (h, w) of an image: the VAE's factor, times the transformer's patch."""
        factor = vae_scale_factor(self.vae.config)
        step = factor * self.transformer.config.patch_size
        if height % step or width % step:
            raise ValueError(f"height and width must be multiples of {step}, got {height}x{width}")
        return height // factor, width // factor

    def packed_shape(self, height: int, width: int) -> tuple[int, int, int]:
        """The engine's sample shape: SD3's latent is not packed, (C, h, w)."""
        return (self.transformer.config.in_channels, *self.latent_size(height, width))

    def velocity_model(
        self,
        height: int,
        width: int,
        guidance: float | None = None,  # None: the family's SAMPLING guidance
        autocast_dtype: torch.dtype | None = None,
        attention_backend: str = "auto",
    ) -> SD3Velocity:
        guidance = self.sampling_guidance(guidance)
        hw = self.latent_size(height, width)  # refuses a size the transformer cannot patch
        self.guidance = guidance  # encode_prompts then adds the empty prompt's rows
        return self.velocity(self.transformer, hw, guidance, autocast_dtype, attention_backend)

    def _encode(self, prompts: list[str], max_sequence_length: int) -> dict:
        device = next(self.text_encoder_3.parameters()).device
        states, pooled = [], []
        for tok, enc in (
            (self.tokenizer, self.text_encoder),
            (self.tokenizer_2, self.text_encoder_2),
        ):
            ids = tok(
                list(prompts),
                padding="max_length",
                max_length=self.tokenizer.model_max_length,
                truncation=True,
                return_tensors="pt",
            ).input_ids.to(device)
            out = enc(ids, output_hidden_states=True)
            states.append(out.hidden_states[-2])
            pooled.append(out[0])  # the projected pooled output (text_embeds)
        t5_ids = self.tokenizer_3(
            list(prompts),
            padding="max_length",
            max_length=max_sequence_length,
            truncation=True,
            add_special_tokens=True,
            return_tensors="pt",
        ).input_ids.to(device)
        t5 = self.text_encoder_3(t5_ids)[0]
        clip = torch.cat(states, dim=-1)
        clip = torch.nn.functional.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
        return {
            "encoder_hidden_states": torch.cat([clip, t5], dim=-2),
            "pooled_projections": torch.cat(pooled, dim=-1),
        }

    @torch.inference_mode()
    def decode(
        self, latents: torch.Tensor, height: int, width: int, batch: int = 64
    ) -> torch.Tensor:
        """Latents [B, C, h, w] → uint8 images [B, H, W, 3] (z / scale + shift, decode)."""
        h, w = self.latent_size(height, width)
        return decode_latents(self.vae, latents, h, w, batch=batch, unpack=False)
