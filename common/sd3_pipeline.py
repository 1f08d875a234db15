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
from typing import Any

import torch

from .flux import compute_dtype, sdpa_backends, transformer_call
from .flux_pipeline import decode_latents, vae_scale_factor
from .loaders import resolve_local_dir

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
NEGATIVE = "negative_"  # cond keys of the empty prompt's embeddings


class SD3Velocity:
    """Adapts an SD3Transformer2DModel to the engine's VelocityModel protocol, with
    classifier-free guidance of scale ``guidance``. cond holds ``encoder_hidden_states``,
    ``pooled_projections`` and, for guidance, their ``negative_`` twins."""

    def __init__(
        self,
        transformer: Any,
        guidance: float = 4.5,
        autocast_dtype: torch.dtype | None = None,
        attention_backend: str = "auto",
    ) -> None:
        self.transformer = transformer
        self.guidance = guidance
        self.autocast_dtype = autocast_dtype
        self.attention_backend = attention_backend
        sdpa_backends(attention_backend)  # an unknown backend is refused here, not at a call
        self.calls = 0

    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    @property
    def guided(self) -> bool:
        return self.guidance is not None and self.guidance > 1.0

    def __call__(
        self, x: torch.Tensor, timestep: torch.Tensor, cond: Mapping[str, torch.Tensor]
    ) -> torch.Tensor:
        device, f32 = self.device, torch.float32
        text, pooled = cond["encoder_hidden_states"], cond["pooled_projections"]
        x, t = x.to(device, f32), timestep.to(device, f32) * 1000.0
        if self.guided:  # the empty prompt's rows first, as diffusers orders them
            text = torch.cat([cond[NEGATIVE + "encoder_hidden_states"], text])
            pooled = torch.cat([cond[NEGATIVE + "pooled_projections"], pooled])
            x, t = torch.cat([x, x]), torch.cat([t, t])
        self.calls += 1
        compute = compute_dtype(self.transformer, self.autocast_dtype)
        with transformer_call(device, compute, self.attention_backend):
            out = self.transformer(
                hidden_states=x,
                timestep=t,
                encoder_hidden_states=text.to(device, f32),
                pooled_projections=pooled.to(device, f32),
                return_dict=False,
            )[0].to(f32)
        if not self.guided:
            return out
        uncond, positive = out.chunk(2)
        return uncond + self.guidance * (positive - uncond)


@dataclass
class SD3Components:
    """The SD3 family (``families.py``): StableDiffusion3Pipeline's components."""

    PIPELINE = "StableDiffusion3Pipeline"

    transformer: Any
    vae: Any
    text_encoder: Any
    text_encoder_2: Any
    text_encoder_3: Any
    tokenizer: Any
    tokenizer_2: Any
    tokenizer_3: Any
    path: Path | None = None
    guidance: float = 4.5  # the classifier-free guidance scale encode_prompts prepares for

    @classmethod
    def load(
        cls,
        path: str | Path,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        text_encoder_dtype: torch.dtype = torch.float32,
    ) -> SD3Components:
        """Every component from a local StableDiffusion3Pipeline directory (never a hub)."""
        from diffusers import AutoencoderKL, SD3Transformer2DModel
        from transformers import AutoTokenizer, CLIPTextModelWithProjection, T5EncoderModel

        root = resolve_local_dir(path, "SD3 pipeline", required=("model_index.json",))
        for sub in COMPONENTS:
            resolve_local_dir(root / sub, f"SD3 pipeline component {sub!r}")
        kw = dict(local_files_only=True)

        def encoder(kind, sub):
            return kind.from_pretrained(root / sub, dtype=text_encoder_dtype, **kw).to(device)

        comps = cls(
            transformer=SD3Transformer2DModel.from_pretrained(
                root, subfolder="transformer", torch_dtype=dtype, **kw
            ).to(device),
            vae=AutoencoderKL.from_pretrained(root, subfolder="vae", **kw).to(device),
            text_encoder=encoder(CLIPTextModelWithProjection, "text_encoder"),
            text_encoder_2=encoder(CLIPTextModelWithProjection, "text_encoder_2"),
            text_encoder_3=encoder(T5EncoderModel, "text_encoder_3"),
            tokenizer=AutoTokenizer.from_pretrained(root / "tokenizer", **kw),
            tokenizer_2=AutoTokenizer.from_pretrained(root / "tokenizer_2", **kw),
            tokenizer_3=AutoTokenizer.from_pretrained(root / "tokenizer_3", **kw),
            path=root,
        )
        return comps.for_inference()

    @staticmethod
    def transformer_class():
        from diffusers import SD3Transformer2DModel

        return SD3Transformer2DModel

    @staticmethod
    def pipeline_class():
        from diffusers import StableDiffusion3Pipeline

        return StableDiffusion3Pipeline

    @staticmethod
    def velocity(
        transformer, latent_hw: tuple[int, int], guidance, autocast_dtype, attention_backend
    ) -> SD3Velocity:
        """The family's velocity adapter over a transformer (the learner's own); SD3's
        transformer patches the latent itself, so the size is not needed."""
        return SD3Velocity(transformer, guidance, autocast_dtype, attention_backend)

    def as_pipeline(self, scheduler):
        """diffusers' pipeline over these very modules (its LoRA loader uses it)."""
        return self.pipeline_class()(
            transformer=self.transformer,
            scheduler=scheduler,
            vae=self.vae,
            text_encoder=self.text_encoder,
            tokenizer=self.tokenizer,
            text_encoder_2=self.text_encoder_2,
            tokenizer_2=self.tokenizer_2,
            text_encoder_3=self.text_encoder_3,
            tokenizer_3=self.tokenizer_3,
        )

    def _models(self) -> tuple:
        return (
            self.transformer,
            self.vae,
            self.text_encoder,
            self.text_encoder_2,
            self.text_encoder_3,
        )

    def for_inference(self) -> SD3Components:
        for model in self._models():
            model.eval().requires_grad_(False)
        return self

    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

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
        guidance: float = 4.5,
        autocast_dtype: torch.dtype | None = None,
        attention_backend: str = "auto",
    ) -> SD3Velocity:
        hw = self.latent_size(height, width)  # refuses a size the transformer cannot patch
        self.guidance = guidance  # encode_prompts then adds the empty prompt's rows
        return self.velocity(self.transformer, hw, guidance, autocast_dtype, attention_backend)

    def encode_prompts(
        self, prompts: list[str], max_sequence_length: int = 256, batch: int = 32
    ) -> dict:
        """StableDiffusion3Pipeline.encode_prompt's tensors in chunks of ``batch``
        prompts, with the empty prompt's when ``guidance`` > 1."""
        if not prompts:
            raise ValueError("prompts: at least one prompt is needed")
        out = {}
        parts = [
            self._encode(prompts[lo : lo + batch], max_sequence_length)
            for lo in range(0, len(prompts), batch)
        ]
        out = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        if self.guidance is not None and self.guidance > 1.0:
            empty = self._encode([""], max_sequence_length)
            for k, v in empty.items():
                out[NEGATIVE + k] = v.expand(len(prompts), *v.shape[1:]).clone()
        return out

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
