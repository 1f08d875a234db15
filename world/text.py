"""The shapes world's text stack, built offline: word-level tokenizers in the real
CLIP/T5 tokenizer classes and tiny CLIP/T5 text encoders (FLUX's two encoders)."""

from __future__ import annotations

import json

from ..common.shapes import COLOURS, SHAPES, all_combinations

WORDS: tuple[str, ...] = ("a", "an", "on", "background", *COLOURS, *SHAPES)
MAX_TOKENS = 16  # CLIP context and T5 max_sequence_length of the tiny world (prompts use 9)
TEXT_DIM = 64


def build_clip_tokenizer():
    """A transformers CLIPTokenizer whose BPE (trained here on the world's prompts)
    maps every word to one token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import CLIPTokenizer

    bpe = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        end_of_word_suffix="</w>",
        special_tokens=["<|startoftext|>", "<|endoftext|>"],
        show_progress=False,
    )
    bpe.train_from_iterator([s.prompt for s in all_combinations()] + list(WORDS), trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return CLIPTokenizer(vocab=model["vocab"], merges=merges, model_max_length=MAX_TOKENS)


def build_t5_tokenizer():
    """A transformers T5TokenizerFast (unigram) with one piece per word."""
    from transformers import T5TokenizerFast

    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [("▁" + w, -1.0) for w in WORDS]
    return T5TokenizerFast(vocab=vocab, extra_ids=0, model_max_length=MAX_TOKENS)


def clip_text_kwargs(vocab_size: int) -> dict:
    """The tiny CLIP text tower shared by the flow model's encoder and shapes_clip."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=TEXT_DIM,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=MAX_TOKENS,
        # eos must not be 2: transformers then pools at the argmax token id (legacy path)
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )


def build_text_encoders(clip_vocab: int, t5_vocab: int, seed: int = 0):
    """Tiny CLIPTextModel (pooled output) and T5EncoderModel (sequence), random init."""
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    torch.manual_seed(seed)
    clip = CLIPTextModel(CLIPTextConfig(**clip_text_kwargs(clip_vocab), projection_dim=TEXT_DIM))
    t5 = T5EncoderModel(
        T5Config(
            vocab_size=t5_vocab,
            d_model=TEXT_DIM,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            dropout_rate=0.0,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
        )
    )
    return clip, t5
