"""The shapes world's text stack, built offline: word-level tokenizers in the real
CLIP/T5 tokenizer classes and tiny CLIP/T5 text encoders (FLUX's two encoders)."""

from __future__ import annotations

import re

from ..common.prompts.shapes import COLOURS, SHAPES, all_combinations

WORDS: tuple[str, ...] = ("a", "an", "on", "background", *COLOURS, *SHAPES)
MAX_TOKENS = 16  # CLIP context and T5 max_sequence_length of the tiny world (prompts use 9)
TEXT_DIM = 64


def build_clip_tokenizer():
    """A transformers CLIPTokenizer whose BPE maps every word of the world to one token.

    The vocabulary and merges are built here, in a fixed order. tokenizers' BpeTrainer
    numbers its end-of-word tokens in hash-map order (huggingface/tokenizers#1794), which
    breaks its ties among merges differently from run to run: a trained vocabulary, and
    every world trained on it, differed between two runs of one command. Here each word's
    merges join a character to the suffix after it, right to left (green: e + n</w>,
    e + en</w>, r + een</w>, g + reen</w>). Only the pair at a word's end is ever a merge,
    so every word becomes one token whatever the order of the merges."""
    from transformers import CLIPTokenizer

    texts = [s.prompt for s in all_combinations()] + list(WORDS)
    words = sorted({w for text in texts for w in re.findall(r"\w+|[^\w\s]+", text.lower())})
    chars = sorted({c for w in words for c in w})
    tokens = ["<|startoftext|>", "<|endoftext|>", *chars, *(c + "</w>" for c in chars)]
    merges: dict[tuple[str, str], None] = {}
    for word in words:
        suffix = word[-1] + "</w>"
        for c in reversed(word[:-1]):
            merges[c, suffix] = None
            suffix = c + suffix
            tokens.append(suffix)
    vocab = {token: i for i, token in enumerate(dict.fromkeys(tokens))}
    return CLIPTokenizer(vocab=vocab, merges=list(merges), model_max_length=MAX_TOKENS)


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
