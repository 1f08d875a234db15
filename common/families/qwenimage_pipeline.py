"""A Qwen-Image pipeline directory (diffusers layout) loaded for rollouts, with the
same interface as ``FluxComponents`` (``families.py``).

What differs from FLUX and SD3, each as diffusers' ``QwenImagePipeline`` does it:

* **Prompts** go through one Qwen2.5-VL language model in a chat template; the first
  ``TEMPLATE_DROP`` positions (the system turn) are dropped, the rest of the last
  hidden state is the text sequence, with an attention mask. Here every prompt is
  padded to ``max_sequence_length`` rows (mask 0), so prompts encoded apart batch
  together; a model call trims the columns no row of its batch uses, which changes
  nothing (the transformer masks those keys and gives text row i RoPE position i
  whatever the padding), and passes no mask when none is left, as the pipeline does.
* **Latents** are FLUX's packed 2x2 tokens [B, (h/2)(w/2), 4C]; the transformer takes
  ``img_shapes`` (frames, h/2, w/2) instead of position ids.
* **Guidance** is true classifier-free guidance with the negative prompt ``" "``
  (Qwen-Image's reference): v = v_u + s·(v_c − v_u), rescaled per token to the
  conditional prediction's norm, v·‖v_c‖/‖v‖. The rescaled velocity is what the SDE step,
  its log-prob and the learner's ratio all see (as SD3's guided velocity). ``guidance``
  ≤ 1 calls the model once, without the negative rows.
* **Timesteps**: the transformer takes σ (the pipeline passes t/1000), as FLUX's.
* **σ grid**: the pipeline gives its scheduler linspace(1, 1/T, T) and a shift μ that
  grows with the image's token count (``pipeline_sigmas``); ``sampling.sigma_grid:
  diffusers`` samples on it.
* **VAE**: AutoencoderKLQwenImage decodes video-shaped latents [B, C, 1, h, w] after
  z·std + mean per channel (its config's ``latents_std`` and ``latents_mean``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from .components import FamilyComponents
from .flux import unpack_latents
from .flux_pipeline import latent_size, vae_scale_factor
from .velocity import GuidedVelocity

COMPONENTS = ("transformer", "vae", "text_encoder", "tokenizer")
NEGATIVE_PROMPT = " "  # Qwen-Image's reference negative prompt (its model card, its demos)
MASK = "encoder_hidden_states_mask"
# QwenImagePipeline's prompt template and the positions it drops (the system turn)
TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
    "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
    "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
TEMPLATE_DROP = 34
TOKENIZER_MAX = 1024  # QwenImagePipeline.tokenizer_max_length (and its max_sequence_length bound)


def image_tokens(vae_config, height: int, width: int) -> int:
    """Packed latent tokens of an image: the count the scheduler's shift μ grows with."""
    factor = 2 * vae_scale_factor(vae_config)
    return (height // factor) * (width // factor)


def pipeline_sigmas(root: str | Path, num_steps: int, height: int, width: int) -> torch.Tensor:
    """The T+1 σ QwenImagePipeline samples at height×width: its scheduler (from the
    directory's scheduler config) given σ = linspace(1, 1/T, T) and, when it shifts by
    resolution, μ = calculate_shift(image tokens); 0 appended by the scheduler."""
    import numpy as np
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

    root = Path(root)
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(root, subfolder="scheduler")
    vae_config = json.loads((root / "vae" / "config.json").read_text())
    c = scheduler.config
    mu = calculate_shift(
        image_tokens(vae_config, height, width),
        c.get("base_image_seq_len", 256),
        c.get("max_image_seq_len", 4096),
        c.get("base_shift", 0.5),
        c.get("max_shift", 1.15),
    )
    sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
    scheduler.set_timesteps(sigmas=sigmas, mu=mu if c.use_dynamic_shifting else None)
    return scheduler.sigmas.to(torch.float64)


class QwenImageVelocity(GuidedVelocity):
    """Adapts a QwenImageTransformer2DModel to the engine's VelocityModel protocol, with
    true classifier-free guidance of scale ``guidance`` and the per-token norm rescale
    (``guided_velocity``). cond holds ``encoder_hidden_states`` and its mask and, for
    guidance, their ``negative_`` twins."""

    NEGATIVE_FIRST = False  # one call on both: the pipeline's two calls, batched

    def __init__(
        self,
        transformer: Any,
        latent_height: int,
        latent_width: int,
        guidance: float | None = 4.0,
        autocast_dtype: torch.dtype | None = None,
        attention_backend: str = "auto",
    ) -> None:
        super().__init__(transformer, guidance, autocast_dtype, attention_backend)
        self.img_shape = (1, latent_height // 2, latent_width // 2)

    def text_inputs(self, cond: Mapping[str, torch.Tensor], prefix: str) -> dict:
        # a plan's traces pass no mask: every row used
        mask = cond[prefix + MASK] if MASK in cond else None
        return {"encoder_hidden_states": cond[prefix + "encoder_hidden_states"], MASK: mask}

    def transformer_inputs(self, x: torch.Tensor, t: torch.Tensor, text: dict) -> dict:
        states, mask = text["encoder_hidden_states"].to(self.device, torch.float32), text[MASK]
        if mask is not None:
            states, mask = trim_padding(states, mask.to(self.device))
        return dict(
            hidden_states=x,
            timestep=t,
            encoder_hidden_states=states,
            encoder_hidden_states_mask=mask,
            img_shapes=[self.img_shape] * x.shape[0],
        )

    def combine(self, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        return guided_velocity(positive, negative, self.guidance)


def guided_velocity(positive: torch.Tensor, negative: torch.Tensor, scale: float) -> torch.Tensor:
    """QwenImagePipeline's true CFG: v = v_u + s(v_c − v_u), rescaled per token to
    ‖v_c‖ (norms over the packed channels)."""
    combined = negative + scale * (positive - negative)
    norm = torch.linalg.vector_norm(positive, dim=-1, keepdim=True)
    return combined * (norm / torch.linalg.vector_norm(combined, dim=-1, keepdim=True))


def trim_padding(text: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """Drop the trailing text columns no row uses; no mask when every row is full."""
    used = mask.bool().any(dim=0).nonzero()
    length = int(used.max()) + 1 if used.numel() else text.shape[1]
    text, mask = text[:, :length], mask[:, :length]
    return text, None if bool(mask.bool().all()) else mask


@dataclass
class QwenImageComponents(FamilyComponents):
    """The Qwen-Image family (``families.py``): QwenImagePipeline's components."""

    PIPELINE = "QwenImagePipeline"
    LABEL = "Qwen-Image pipeline"
    COMPONENTS = COMPONENTS
    # the pipeline's own σ grid (shifted by the image's size), σ itself as the timestep
    SAMPLING: ClassVar[dict] = {
        "guidance": 4.0,
        "sigma_grid": "diffusers",
        "quantize_timestep": False,
    }
    NEGATIVE_PROMPT = NEGATIVE_PROMPT

    transformer: Any
    vae: Any
    text_encoder: Any
    tokenizer: Any
    path: Path | None = None
    guidance: float = SAMPLING["guidance"]  # the true-CFG scale encode_prompts prepares for

    @staticmethod
    def transformer_class():
        from diffusers import QwenImageTransformer2DModel

        return QwenImageTransformer2DModel

    @staticmethod
    def module_classes() -> dict[str, Any]:
        from diffusers import AutoencoderKLQwenImage
        from transformers import Qwen2_5_VLForConditionalGeneration

        return {"vae": AutoencoderKLQwenImage, "text_encoder": Qwen2_5_VLForConditionalGeneration}

    @staticmethod
    def velocity(
        transformer, latent_hw: tuple[int, int], guidance, autocast_dtype, attention_backend
    ) -> QwenImageVelocity:
        """The family's velocity adapter over a transformer (the learner's own)."""
        return QwenImageVelocity(
            transformer, *latent_hw, guidance, autocast_dtype, attention_backend
        )

    def latent_size(self, height: int, width: int) -> tuple[int, int]:
        """Unpacked latent (h, w) of an image; both must pack into 2x2 tokens (FLUX's rule,
        with the 3-D VAE's scale factor)."""
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
    ) -> QwenImageVelocity:
        guidance = self.sampling_guidance(guidance)
        hw = self.latent_size(height, width)
        self.guidance = guidance  # encode_prompts then adds the negative prompt's rows
        return self.velocity(self.transformer, hw, guidance, autocast_dtype, attention_backend)

    def sigmas(self, num_steps: int, height: int, width: int) -> torch.Tensor:
        """The pipeline's own σ at this size (``sampling.sigma_grid: diffusers``)."""
        if self.path is None:
            raise ValueError("the pipeline's σ grid needs the directory it was loaded from")
        return pipeline_sigmas(self.path, num_steps, height, width)

    def check_sequence_length(self, max_sequence_length: int) -> None:
        if not 1 <= max_sequence_length <= TOKENIZER_MAX:
            raise ValueError(
                f"max_sequence_length must lie in [1, {TOKENIZER_MAX}] (QwenImagePipeline's "
                f"bound), got {max_sequence_length}"
            )

    def _encode(self, prompts: list[str], max_sequence_length: int) -> dict:
        device = next(self.text_encoder.parameters()).device
        tokens = self.tokenizer(
            [TEMPLATE.format(p) for p in prompts],
            max_length=TOKENIZER_MAX + TEMPLATE_DROP,
            padding=True,
            truncation=True,
            return_tensors="pt",
        ).to(device)
        hidden = self.text_encoder(
            input_ids=tokens.input_ids,
            attention_mask=tokens.attention_mask,
            output_hidden_states=True,
        ).hidden_states[-1]
        states = hidden.new_zeros(len(prompts), max_sequence_length, hidden.shape[-1])
        mask = torch.zeros(len(prompts), max_sequence_length, dtype=torch.float32)
        for i, (row, keep) in enumerate(zip(hidden, tokens.attention_mask.bool(), strict=True)):
            text = row[keep][TEMPLATE_DROP:][:max_sequence_length]  # the user turn on
            states[i, : len(text)], mask[i, : len(text)] = text, 1.0
        return {"encoder_hidden_states": states.float(), MASK: mask.to(device)}

    @torch.inference_mode()
    def decode(
        self, packed: torch.Tensor, height: int, width: int, batch: int = 64
    ) -> torch.Tensor:
        """Packed latents [B, L, C] → uint8 images [B, H, W, 3]: unpack, z·std + mean
        per channel, decode the one-frame video, take the frame."""
        h, w = self.latent_size(height, width)
        config = self.vae.config
        device, dtype = next(self.vae.parameters()).device, next(self.vae.parameters()).dtype
        mean = torch.tensor(config.latents_mean, device=device).view(1, -1, 1, 1, 1)
        std = torch.tensor(config.latents_std, device=device).view(1, -1, 1, 1, 1)
        out = []
        for lo in range(0, packed.shape[0], batch):
            z = unpack_latents(packed[lo : lo + batch].to(device, torch.float32), h, w)
            z = (z.unsqueeze(2) * std + mean).to(dtype)
            img = self.vae.decode(z, return_dict=False)[0][:, :, 0]
            img = ((img.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
            out.append(img.permute(0, 2, 3, 1).cpu())
        return torch.cat(out)
