"""``g2rpo convert-reward KIND SRC OUT``: a published reward checkpoint → a normal
``from_pretrained`` directory (weights, config, tokenizer, image processor, and
``conversion.json`` recording the source, its sha256 and anything left over).

Kinds: ``hpsv2`` (HPS_v2.1_compressed.pt), ``dfn5b_clip`` (DFN5B-CLIP-ViT-H-14(-378)),
``openclip`` (another OpenCLIP ViT; give its ``open_clip_config.json``) and
``image_reward`` (ImageReward.pt).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from ...common.errors import UsageError

KINDS = ("hpsv2", "dfn5b_clip", "openclip", "image_reward")


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _openclip_arch(kind: str, openclip_config: Path | None):
    from .openclip import PRESETS, OpenClipArch

    arch = PRESETS[kind]
    mean = std = None
    resize = "shortest"
    if openclip_config is not None:
        cfg = json.loads(Path(openclip_config).read_text())
        model = cfg.get("model_cfg", cfg)
        vision, text = model.get("vision_cfg", {}), model.get("text_cfg", {})
        text_heads = text.get("heads")
        # what the file leaves out: open_clip's defaults for a generic model, else the preset's
        head = 64 if kind == "openclip" else arch.vision_head_width
        quick = False if kind == "openclip" else arch.quick_gelu
        arch = OpenClipArch(
            vision_head_width=vision.get("head_width", head),
            text_head_width=text["width"] // text_heads if text_heads else arch.text_head_width,
            quick_gelu=bool(model.get("quick_gelu", quick)),
        )
        pre = cfg.get("preprocess_cfg", {})
        mean, std = pre.get("mean"), pre.get("std")
        resize = pre.get("resize_mode", "shortest")
    return arch, mean, std, resize


def openclip_image_processor(size: int, mean, std, resize: str = "shortest"):
    """open_clip's eval transform: bicubic resize (shortest side, or ``squash`` to a
    square), centre crop, OpenAI mean/std unless the model says otherwise."""
    from transformers.models.clip import CLIPImageProcessorPil

    from .openclip import OPENAI_MEAN, OPENAI_STD

    if resize == "squash":
        kw = dict(size={"height": size, "width": size}, do_center_crop=False)
    else:
        kw = dict(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    return CLIPImageProcessorPil(
        **kw,
        resample=3,  # PIL bicubic, as torchvision's Resize on PIL images
        image_mean=list(mean or OPENAI_MEAN),
        image_std=list(std or OPENAI_STD),
    )


def convert_reward(
    kind: str,
    src: str | Path,
    out: str | Path,
    *,
    tokenizer: str | Path,
    openclip_config: str | Path | None = None,
    head_width: int | None = None,
) -> dict:
    """Convert ``src`` into ``out``; returns what conversion.json records."""
    if kind not in KINDS:
        raise UsageError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    src, out = Path(src).expanduser(), Path(out).expanduser()
    from .checkpoint import load_state_dict

    state = load_state_dict(src)
    what = f"{kind} checkpoint {src}"
    if kind == "image_reward":
        from ..scorers.image_reward_model import ImageRewardModel
        from .image_reward import image_reward_to_transformers
        from .tokenizers import blip_bert_tokenizer

        config, weights, leftover = image_reward_to_transformers(state, head_width or 64, what)
        vocab = config.text_config["vocab_size"]
        tok = blip_bert_tokenizer(tokenizer, config.prompt_tokens, vocab, what)
        config.text_config.update(
            bos_token_id=tok.convert_tokens_to_ids("[DEC]"),
            sep_token_id=tok.sep_token_id,
            pad_token_id=tok.pad_token_id,
        )
        model = ImageRewardModel(config)
        processor = openclip_image_processor(config.vision_config["image_size"], None, None)
    else:
        from dataclasses import replace

        from transformers import CLIPModel

        from .openclip import openclip_to_clip
        from .tokenizers import clip_tokenizer

        if kind == "openclip" and openclip_config is None:
            raise UsageError("kind openclip needs --openclip-config (its open_clip_config.json)")
        arch, mean, std, resize = _openclip_arch(kind, openclip_config and Path(openclip_config))
        if head_width:
            arch = replace(arch, vision_head_width=head_width)
        config, weights, leftover = openclip_to_clip(state, arch, what)
        model = CLIPModel(config)
        t = config.text_config
        tok = clip_tokenizer(tokenizer, t.max_position_embeddings, t.vocab_size, what)
        processor = openclip_image_processor(config.vision_config.image_size, mean, std, resize)
    dtypes = {str(v.dtype).removeprefix("torch.") for v in weights.values()}
    model.load_state_dict(weights, strict=True, assign=True)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    processor.save_pretrained(out)
    record = {
        "kind": kind,
        "source": str(src),
        "source_sha256": file_sha256(src),
        "source_tensors": len(state),
        "source_dtypes": sorted(dtypes),
        "left_over": leftover,
    }
    (out / "conversion.json").write_text(json.dumps(record, indent=1))
    if leftover:
        print(
            f"convert-reward: {len(leftover)} tensor(s) in {src} are not part of the {kind} "
            f"scorer and were not converted (listed in {out / 'conversion.json'}): "
            + ", ".join(leftover[:5]),
            file=sys.stderr,
        )
    return record


__all__ = ["KINDS", "CheckpointMismatch", "convert_reward", "file_sha256"]


def __getattr__(name: str):
    # torch is imported by the conversion, not by `g2rpo --help` (which lists KINDS)
    if name == "CheckpointMismatch":
        from .checkpoint import CheckpointMismatch

        return CheckpointMismatch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
