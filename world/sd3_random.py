"""A random StableDiffusion3Pipeline directory in the shapes world's text stack: the
SD3 family's test model (its layout is SD3.5-Medium's: CLIP-L and CLIP-G with
projections, T5, an MMDiT transformer, a 16-channel VAE with scale and shift).

Saved as diffusers saves a ``StableDiffusion3Pipeline``, so the loaders that read
SD3.5-Medium read it, and diffusers' own pipeline runs on it (the parity test).
``g2rpo rehearse`` builds its SD3 pipelines from the same text stack."""

from __future__ import annotations

from pathlib import Path

import torch

from .text import MAX_TOKENS, TEXT_DIM, build_clip_tokenizer, build_t5_tokenizer, clip_text_kwargs

SD3_VAE = dict(scaling_factor=1.5305, shift_factor=0.0609)  # SD3.5's VAE config values
T5_DIM = 2 * TEXT_DIM  # at least CLIP-L's + CLIP-G's states, as T5-XXL's 4096
POOLED_DIM = TEXT_DIM  # CLIP-L's + CLIP-G's projections


def sd3_text_stack(clip_tokens: int = MAX_TOKENS) -> dict:
    """CLIP-L and CLIP-G (with projections), T5 and their word-level tokenizers, random,
    CLIP's context ``clip_tokens`` long (SD3.5's is 77)."""
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    clip_tok, t5_tok = build_clip_tokenizer(), build_t5_tokenizer()
    clip_tok.model_max_length = clip_tokens
    clip = {**clip_text_kwargs(len(clip_tok)), "max_position_embeddings": clip_tokens}

    def clip_model():
        return CLIPTextModelWithProjection(
            CLIPTextConfig(**clip, projection_dim=POOLED_DIM // 2)
        ).eval()

    t5 = T5EncoderModel(
        T5Config(
            vocab_size=len(t5_tok),
            d_model=T5_DIM,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_heads=4,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
        )
    ).eval()
    return dict(
        text_encoder=clip_model(),
        tokenizer=clip_tok,
        text_encoder_2=clip_model(),
        tokenizer_2=clip_tok,
        text_encoder_3=t5,
        tokenizer_3=t5_tok,
    )


def save_sd3_pipeline(out: str | Path, transformer, vae, text: dict, shift: float = 3.0) -> Path:
    """Save the parts as diffusers saves a StableDiffusion3Pipeline."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from ..common.families.sd3_pipeline import SD3Components

    comps = SD3Components(transformer=transformer, vae=vae, **text)
    return comps.save(out, FlowMatchEulerDiscreteScheduler(shift=shift))


def build_random_sd3_pipeline(out: str | Path, seed: int = 0, width: int = 16) -> Path:
    """Build and save a random SD3 pipeline of transformer ``width`` under ``out``."""
    from diffusers import AutoencoderKL, SD3Transformer2DModel

    torch.manual_seed(seed)
    text = sd3_text_stack()
    transformer = SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=16,
        num_layers=2,
        attention_head_dim=width // 2,
        num_attention_heads=2,
        joint_attention_dim=T5_DIM,
        caption_projection_dim=width,
        pooled_projection_dim=POOLED_DIM,
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
    return save_sd3_pipeline(out, transformer, vae, text)
