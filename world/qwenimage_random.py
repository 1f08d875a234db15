"""A random QwenImagePipeline directory in the shapes world's vocabulary: the Qwen-Image
family's test model (its layout is Qwen-Image's: a Qwen2.5-VL language model with a
byte-level BPE tokenizer and Qwen's chat tokens, the MMDiT transformer with 3-axis
RoPE, the causal 3-D VAE with per-channel latent mean and std, and Qwen-Image's
resolution-shifted scheduler).

Saved as diffusers saves a ``QwenImagePipeline``, so the loaders that read Qwen-Image
read it, and diffusers' own pipeline runs on it (the parity test). The tokenizer maps
each word of the world and of the pipeline's prompt template to one token, so the
template's system turn is 34 tokens long, the count the pipeline drops, as with Qwen's
own tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..common.families.qwenimage_pipeline import (
    NEGATIVE_PROMPT,
    TEMPLATE,
    TEMPLATE_DROP,
    QwenImageComponents,
)
from ..common.prompts.shapes import all_combinations
from .text import TEXT_DIM

CHAT_TOKENS = ("<|im_start|>", "<|im_end|>")
# Qwen-Image's scheduler_config.json: exponential shift with μ from the image's tokens,
# the last σ before 0 stretched to 0.02
QWEN_IMAGE_SCHEDULER = dict(
    base_image_seq_len=256,
    base_shift=0.5,
    max_image_seq_len=8192,
    max_shift=0.9,
    num_train_timesteps=1000,
    shift=1.0,
    shift_terminal=0.02,
    time_shift_type="exponential",
    use_dynamic_shifting=True,
)


def build_qwen_tokenizer():
    """A transformers Qwen2Tokenizer (byte-level BPE, trained here on the templated world
    prompts) with Qwen's chat tokens as special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=["<|endoftext|>", *CHAT_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [TEMPLATE.format(p) for p in [NEGATIVE_PROMPT, *(s.prompt for s in all_combinations())]]
    bpe.train_from_iterator(texts, trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tokenizer = Qwen2Tokenizer(
        vocab=model["vocab"],
        merges=merges,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
    )
    tokenizer.add_tokens(list(CHAT_TOKENS), special_tokens=True)
    system = TEMPLATE.split("{}")[0]
    if len(tokenizer(system).input_ids) != TEMPLATE_DROP:  # the pipeline drops exactly these
        raise RuntimeError("the template's system turn is not 34 tokens in the test tokenizer")
    return tokenizer


def build_qwen_text_encoder(vocab_size: int, hidden: int = TEXT_DIM):
    """A random Qwen2.5-VL (2 language layers, a 1-block vision tower that text-only
    prompts never run), multimodal RoPE split as the real model's in proportion."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    heads = 4
    half = hidden // heads // 2  # mrope_section covers half of a head's dimensions
    third = half // 3
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=vocab_size,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=2,
            num_attention_heads=heads,
            num_key_value_heads=2,
            bos_token_id=None,  # Qwen's own ids lie past this vocabulary
            eos_token_id=None,
            max_position_embeddings=1024 + TEMPLATE_DROP,
            rope_scaling={
                "type": "mrope",
                "mrope_section": [half - 2 * third, third, third],
            },
        ),
        vision_config=dict(
            depth=1,
            hidden_size=16,
            intermediate_size=32,
            num_heads=2,
            out_hidden_size=hidden,
            fullatt_block_indexes=[0],
        ),
        # the image, video and vision-start ids past the text vocabulary
        image_token_id=vocab_size + 1,
        video_token_id=vocab_size + 2,
        vision_start_token_id=vocab_size + 3,
    )
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def save_qwenimage_pipeline(out: str | Path, transformer, vae, text_encoder, tokenizer) -> Path:
    """Save the parts as diffusers saves a QwenImagePipeline."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    comps = QwenImageComponents(transformer, vae, text_encoder, tokenizer)
    return comps.save(out, FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER))


def qwen_transformer(
    num_layers: int, num_heads: int, head_dim: int, joint_dim: int, rope_axes: tuple
):
    """A QwenImageTransformer2DModel in Qwen-Image's layout (2×2 patches of 16 latent
    channels) at a test width and depth; ``rope_axes`` (frame, height, width) sum to
    ``head_dim``."""
    from diffusers import QwenImageTransformer2DModel

    return QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=64,
        out_channels=16,
        num_layers=num_layers,
        attention_head_dim=head_dim,
        num_attention_heads=num_heads,
        joint_attention_dim=joint_dim,
        axes_dims_rope=rope_axes,
    )


def build_random_qwenimage_pipeline(out: str | Path, seed: int = 0, width: int = 16) -> Path:
    """Build and save a random Qwen-Image pipeline of transformer ``width`` under ``out``."""
    from diffusers import AutoencoderKLQwenImage

    torch.manual_seed(seed)
    tokenizer = build_qwen_tokenizer()
    text_encoder = build_qwen_text_encoder(len(tokenizer))
    head = width // 2
    joint = text_encoder.config.text_config.hidden_size
    transformer = qwen_transformer(2, 2, head, joint, (head // 4, head // 4, head // 2))
    vae = AutoencoderKLQwenImage(
        base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, attn_scales=[]
    )
    return save_qwenimage_pipeline(out, transformer, vae, text_encoder, tokenizer)
