"""A FLUX pipeline directory (diffusers layout) loaded for rollouts and training.

Loads the components FluxPipeline.from_pretrained would (transformer, VAE, CLIP and
T5 text encoders with their tokenizers, scheduler) from a local directory only,
encodes prompts exactly as FluxPipeline.encode_prompt does (T5 sequence padded to
max_sequence_length, CLIP pooled output), and decodes packed latents to uint8
images with the VAE's scaling and shift factors. The same code serves FLUX.1-dev.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from .components import FamilyComponents
from .flux import FluxVelocity, unpack_latents

COMPONENTS = ("transformer", "vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2")


@dataclass
class FluxComponents(FamilyComponents):
    """The FLUX family (``families.py``): FluxPipeline's components."""

    PIPELINE = "FluxPipeline"
    LABEL = "FLUX pipeline"
    COMPONENTS = COMPONENTS
    SAMPLING: ClassVar[dict] = {"guidance": 3.5}  # FLUX.1-dev's distilled guidance

    transformer: Any
    vae: Any  # decodes in fp32 (the official code decodes in bf16 on GPU)
    text_encoder: Any
    text_encoder_2: Any
    tokenizer: Any
    tokenizer_2: Any
    path: Path | None = None

    @staticmethod
    def transformer_class():
        from diffusers import FluxTransformer2DModel

        return FluxTransformer2DModel

    @staticmethod
    def module_classes() -> dict[str, Any]:
        from diffusers import AutoencoderKL
        from transformers import CLIPTextModel, T5EncoderModel

        return {
            "vae": AutoencoderKL,
            "text_encoder": CLIPTextModel,
            "text_encoder_2": T5EncoderModel,
        }

    @staticmethod
    def velocity(
        transformer, latent_hw: tuple[int, int], guidance, autocast_dtype, attention_backend
    ) -> FluxVelocity:
        """The family's velocity adapter over a transformer (the learner's own)."""
        return FluxVelocity(
            transformer,
            *latent_hw,
            guidance=guidance,
            autocast_dtype=autocast_dtype,
            attention_backend=attention_backend,
        )

    @property
    def vae_scale_factor(self) -> int:
        return vae_scale_factor(self.vae.config)

    def latent_size(self, height: int, width: int) -> tuple[int, int]:
        """Unpacked latent (h, w) of an image; FLUX needs both divisible by 2·vae factor."""
        return latent_size(self.vae.config, height, width)

    def packed_shape(self, height: int, width: int) -> tuple[int, int]:
        """(tokens, channels) of one packed latent: the engine's sample shape."""
        h, w = self.latent_size(height, width)
        return (h // 2) * (w // 2), self.transformer.config.in_channels

    def velocity_model(
        self,
        height: int,
        width: int,
        guidance: float | None = None,  # None: the family's SAMPLING guidance
        autocast_dtype: torch.dtype | None = None,
        attention_backend: str = "auto",
    ) -> FluxVelocity:
        guidance = self.sampling_guidance(guidance)
        hw = self.latent_size(height, width)
        return self.velocity(self.transformer, hw, guidance, autocast_dtype, attention_backend)

    def _encode(self, prompts: list[str], max_sequence_length: int) -> dict:
        return encode_prompts(
            self.tokenizer,
            self.text_encoder,
            self.tokenizer_2,
            self.text_encoder_2,
            prompts,
            max_sequence_length,
        )

    @torch.inference_mode()
    def decode(
        self, packed: torch.Tensor, height: int, width: int, batch: int = 64
    ) -> torch.Tensor:
        """Packed latents [B, L, C] → uint8 images [B, H, W, 3] (batched VAE decode)."""
        return decode_latents(self.vae, packed, *self.latent_size(height, width), batch=batch)


def vae_scale_factor(vae_config) -> int:
    """Pixels per latent pixel: 2 per down block after the first (FluxPipeline's and
    StableDiffusion3Pipeline's rule), or for Qwen-Image's 3-D VAE 2 per entry of its
    ``temperal_downsample`` (QwenImagePipeline's)."""
    if "temperal_downsample" in vae_config:  # diffusers' spelling
        return 2 ** len(vae_config["temperal_downsample"])
    return 2 ** (len(vae_config["block_out_channels"]) - 1)


def latent_size(vae_config, height: int, width: int) -> tuple[int, int]:
    """Unpacked latent (h, w) of a height×width image for a VAE of this config."""
    factor = vae_scale_factor(vae_config)
    if height % (2 * factor) or width % (2 * factor):
        raise ValueError(
            f"height and width must be multiples of {2 * factor}, got {height}x{width}"
        )
    return height // factor, width // factor


def encode_prompts(
    tokenizer,
    text_encoder,
    tokenizer_2,
    text_encoder_2,
    prompts: list[str],
    max_sequence_length: int,
) -> dict[str, torch.Tensor]:
    """FluxPipeline.encode_prompt's tensors, with gradients when the encoders train:
    ``encoder_hidden_states`` = T5 last hidden state over max_sequence_length tokens
    (no attention mask, as diffusers), ``pooled_projections`` = CLIP pooled output."""
    if not prompts:
        raise ValueError("prompts: at least one prompt is needed")
    device = next(text_encoder_2.parameters()).device
    t5_ids = tokenizer_2(
        list(prompts),
        padding="max_length",
        max_length=max_sequence_length,
        truncation=True,
        return_tensors="pt",
    ).input_ids.to(device)
    clip_ids = tokenizer(
        list(prompts),
        padding="max_length",
        max_length=tokenizer.model_max_length,
        truncation=True,
        return_tensors="pt",
    ).input_ids.to(device)
    return {
        "encoder_hidden_states": text_encoder_2(t5_ids, output_hidden_states=False)[0],
        "pooled_projections": text_encoder(clip_ids, output_hidden_states=False).pooler_output,
    }


def decode_latents(
    vae, packed: torch.Tensor, latent_h: int, latent_w: int, batch: int = 64, unpack: bool = True
) -> torch.Tensor:
    """Unpack (FLUX's tokens; ``unpack`` False for a family whose latents are already
    [B, C, h, w], as SD3's), undo the VAE's (z − shift)·scale, decode; returns uint8
    [B, H, W, 3] on CPU."""
    scale, shift = vae.config.scaling_factor, vae.config.shift_factor or 0.0
    device, dtype = next(vae.parameters()).device, next(vae.parameters()).dtype
    out = []
    for lo in range(0, packed.shape[0], batch):
        z = packed[lo : lo + batch].float()
        if unpack:
            z = unpack_latents(z, latent_h, latent_w)
        img = vae.decode((z / scale + shift).to(device, dtype), return_dict=False)[0]
        img = ((img.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        out.append(img.permute(0, 2, 3, 1).cpu())
    return torch.cat(out)


def save_prompt_embeddings(path: str | Path, prompts: list[str], embeds: dict) -> None:
    """Prompt-embedding cache (safetensors), as the official preprocessing precomputes."""
    import json

    from safetensors.torch import save_file

    tensors = {k: v.detach().float().cpu().contiguous() for k, v in embeds.items()}
    save_file(tensors, str(path), metadata={"prompts": json.dumps(list(prompts))})


def load_prompt_embeddings(path: str | Path) -> tuple[list[str], dict[str, torch.Tensor]]:
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"prompt-embedding cache not found: {p}")
    with safe_open(str(p), "pt") as f:
        meta = f.metadata() or {}
    if "prompts" not in meta:
        raise ValueError(f"{p}: not a g2rpo prompt-embedding cache (no prompts in its metadata)")
    return json.loads(meta["prompts"]), load_file(str(p))
