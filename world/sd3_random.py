"""A random StableDiffusion3Pipeline directory in the shapes world's text stack: the
SD3 family's test model (its layout is SD3.5-Medium's: CLIP-L and CLIP-G with
projections, T5, an MMDiT transformer, a 16-channel VAE with scale and shift).

Saved as diffusers saves a ``StableDiffusion3Pipeline``, so the loaders that read
SD3.5-Medium read it, and diffusers' own pipeline runs on it (the parity test)."""

from __future__ import annotations

from pathlib import Path

import torch

from .text import MAX_TOKENS, TEXT_DIM, build_clip_tokenizer, build_t5_tokenizer, clip_text_kwargs

SD3_VAE = dict(scaling_factor=1.5305, shift_factor=0.0609)  # SD3.5's VAE config values


def build_random_sd3_pipeline(out: str | Path, seed: int = 0, width: int = 16) -> Path:
    """Build and save a random SD3 pipeline of transformer ``width`` under ``out``."""
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    torch.manual_seed(seed)
    clip_tok, t5_tok = build_clip_tokenizer(), build_t5_tokenizer()
    clip_l = CLIPTextModelWithProjection(
        CLIPTextConfig(**clip_text_kwargs(len(clip_tok)), projection_dim=TEXT_DIM // 2)
    )
    clip_g = CLIPTextModelWithProjection(
        CLIPTextConfig(**clip_text_kwargs(len(clip_tok)), projection_dim=TEXT_DIM // 2)
    )
    t5 = T5EncoderModel(
        T5Config(
            vocab_size=len(t5_tok),
            d_model=2 * TEXT_DIM,  # at least CLIP-L + CLIP-G's states, as T5-XXL's 4096
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_heads=4,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
        )
    )
    transformer = SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=16,
        num_layers=2,
        attention_head_dim=width // 2,
        num_attention_heads=2,
        joint_attention_dim=2 * TEXT_DIM,
        caption_projection_dim=width,
        pooled_projection_dim=TEXT_DIM,  # CLIP-L's + CLIP-G's projections
        out_channels=16,
        pos_embed_max_size=32,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(8, 8, 8),
        layers_per_block=1,
        latent_channels=16,
        norm_num_groups=4,
        use_quant_conv=False,
        use_post_quant_conv=False,
        **SD3_VAE,
    )
    pipe = StableDiffusion3Pipeline(
        transformer=transformer.eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=vae.eval(),
        text_encoder=clip_l.eval(),
        tokenizer=clip_tok,
        text_encoder_2=clip_g.eval(),
        tokenizer_2=clip_tok,
        text_encoder_3=t5.eval(),
        tokenizer_3=t5_tok,
    )
    path = Path(out)
    pipe.save_pretrained(path)
    return path


__all__ = ["MAX_TOKENS", "build_random_sd3_pipeline"]
