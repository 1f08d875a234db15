"""Random-weight reward models at published sizes, saved in the converted layout, so
``g2rpo bench reward`` measures serving cost without a download."""

from __future__ import annotations

from pathlib import Path

from ..common.errors import UsageError

# OpenCLIP ViT-H-14 (HPS-v2.1, DFN5B, PickScore's tower) in transformers' CLIP terms
SIZES = {
    "vit-h-14": dict(
        vision=dict(
            hidden_size=1280,
            intermediate_size=5120,
            num_hidden_layers=32,
            num_attention_heads=16,
            image_size=224,
            patch_size=14,
        ),
        text=dict(
            hidden_size=1024,
            intermediate_size=4096,
            num_hidden_layers=24,
            num_attention_heads=16,
            max_position_embeddings=77,
            vocab_size=49408,
        ),
        projection_dim=1024,
    ),
    # `g2rpo rehearse`: a scorer's input resolution (what the server resizes 720² images
    # to), a few channels wide
    "rehearsal": dict(
        vision=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=224,
            patch_size=32,
        ),
        text=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=77,
            vocab_size=514,
        ),
        projection_dim=16,
    ),
    "tiny": dict(
        vision=dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        ),
        text=dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=77,
            vocab_size=514,
        ),
        projection_dim=32,
    ),
}


def random_clip_dir(out: str | Path, size: str, seed: int = 0) -> Path:
    """A random CLIPModel of ``size`` with a byte-level CLIP tokenizer (its ids fit any
    vocabulary) and open_clip's eval image processor, ready for ``--scorers NAME=DIR``."""
    import torch
    from transformers import CLIPConfig, CLIPModel

    from .convert import openclip_image_processor

    if size not in SIZES:
        raise UsageError(f"--random-model must be one of {', '.join(SIZES)}, got {size!r}")
    spec = SIZES[size]
    torch.manual_seed(seed)
    text = dict(spec["text"], bos_token_id=512, eos_token_id=513, pad_token_id=513)
    config = CLIPConfig(
        text_config=text, vision_config=spec["vision"], projection_dim=spec["projection_dim"]
    )
    out = Path(out)
    CLIPModel(config).save_pretrained(out)
    byte_level_clip_tokenizer().save_pretrained(out)
    openclip_image_processor(spec["vision"]["image_size"], None, None).save_pretrained(out)
    return out


def byte_level_clip_tokenizer(context_length: int = 77):
    """CLIP's tokenizer with no merges: the 512 byte symbols (bare and word-final), then
    start/end of text (ids 512, 513). Its ids fit any CLIP vocabulary."""
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = list(bytes_to_unicode().values())
    vocab = {c: i for i, c in enumerate(chars)}
    vocab.update({c + "</w>": len(chars) + i for i, c in enumerate(chars)})
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = len(vocab), len(vocab) + 1
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=context_length)


def random_image_reward_dir(out: str | Path, seed: int = 0) -> Path:
    """A random ImageReward at its input resolution (224²), a few channels wide, in the
    layout `g2rpo convert-reward image_reward` writes (model, BERT tokenizer with BLIP's
    [DEC]/[ENC], open_clip's eval image processor), for `g2rpo rehearse`."""
    import tempfile

    import torch
    from transformers import BertTokenizer

    from ..common.prompts.shapes import COLOURS, SHAPES
    from .convert import openclip_image_processor
    from .scorers.image_reward_model import ImageRewardConfig, ImageRewardModel

    words = ["a", "an", "on", "background", *COLOURS, *SHAPES]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *letters]
    vocab += ["##" + c for c in letters]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "vocab.txt").write_text("\n".join(vocab) + "\n")
        tok = BertTokenizer(str(Path(tmp) / "vocab.txt"), do_lower_case=True)
    tok.add_special_tokens({"bos_token": "[DEC]", "additional_special_tokens": ["[ENC]"]})
    config = ImageRewardConfig(
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=224,
            patch_size=32,
            layer_norm_eps=1e-6,
            hidden_act="gelu",
        ),
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=32,
            encoder_hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=40,
            layer_norm_eps=1e-12,
            hidden_act="gelu",
            pad_token_id=tok.pad_token_id,
            bos_token_id=tok.convert_tokens_to_ids("[DEC]"),
            sep_token_id=tok.sep_token_id,
        ),
        embed_dim=16,
    )
    tok.model_max_length = config.prompt_tokens
    torch.manual_seed(seed)
    out = Path(out)
    ImageRewardModel(config).save_pretrained(out)
    tok.save_pretrained(out)
    openclip_image_processor(224, None, None).save_pretrained(out)
    return out
