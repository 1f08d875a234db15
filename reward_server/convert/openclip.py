"""OpenCLIP ViT checkpoints (HPS-v2.1, DFN5B-CLIP) → ``transformers.CLIPModel``.

open_clip and torchvision do not import on our CPU torch, and transformers' CLIP is
the same architecture: pre-LN transformer towers, a class token and ``ln_post`` +
``proj`` on the image side, causal text attention pooled at the end-of-text token
and ``text_projection``. The only re-layout is nn.MultiheadAttention's fused
``in_proj`` (q; k; v stacked on dim 0) split into q/k/v projections, and the
``proj``/``text_projection`` matrices (x @ P) transposed into Linear weights.

What the shapes cannot tell — heads per tower and the activation — comes from the
kind's preset (ViT-H-14: 80-wide vision heads, 64-wide text heads; DFN5B uses
QuickGELU) and can be overridden for other OpenCLIP models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .checkpoint import CheckpointMismatch, TensorLedger, require

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
# buffers some open_clip versions save; they hold no weights (the causal mask)
IGNORABLE = ("attn_mask",)


@dataclass(frozen=True)
class OpenClipArch:
    """What an OpenCLIP state dict does not encode in its shapes."""

    vision_head_width: int = 80
    text_head_width: int = 64
    quick_gelu: bool = False


# ViT-H-14 (HPS-v2.1's base: laion2B-s32B-b79K, GELU); DFN5B-CLIP-ViT-H-14(-378) is
# the same tower trained with QuickGELU (open_clip's "-quickgelu" model names)
PRESETS = {
    "hpsv2": OpenClipArch(80, 64, quick_gelu=False),
    "dfn5b_clip": OpenClipArch(80, 64, quick_gelu=True),
    "openclip": OpenClipArch(80, 64, quick_gelu=False),
}


def _tower_layers(state: dict, prefix: str) -> int:
    n = 0
    while f"{prefix}transformer.resblocks.{n}.ln_1.weight" in state:
        n += 1
    return n


def clip_config_from_openclip(state: dict[str, torch.Tensor], arch: OpenClipArch, what: str):
    """The ``CLIPConfig`` an OpenCLIP state dict describes."""
    from transformers import CLIPConfig

    conv = require(state, "visual.conv1.weight", what)
    vpos = require(state, "visual.positional_embedding", what)
    vfc = require(state, "visual.transformer.resblocks.0.mlp.c_fc.weight", what)
    proj = require(state, "visual.proj", what)
    tok = require(state, "token_embedding.weight", what)
    tpos = require(state, "positional_embedding", what)
    tfc = require(state, "transformer.resblocks.0.mlp.c_fc.weight", what)
    vwidth, patch = conv.shape[0], conv.shape[-1]
    grid = math.isqrt(vpos.shape[0] - 1)
    if grid * grid != vpos.shape[0] - 1:
        rows = vpos.shape[0]
        raise CheckpointMismatch(f"{what}: visual.positional_embedding has {rows} rows, not 1 + n²")
    twidth = tok.shape[1]
    for width, head, field in (
        (vwidth, arch.vision_head_width, "vision_head_width"),
        (twidth, arch.text_head_width, "text_head_width"),
    ):
        if width % head:
            raise CheckpointMismatch(
                f"{what}: {field} {head} does not divide the tower width {width}"
            )
    act = "quick_gelu" if arch.quick_gelu else "gelu"
    vocab = tok.shape[0]
    text = dict(
        vocab_size=vocab,
        hidden_size=twidth,
        intermediate_size=tfc.shape[0],
        num_hidden_layers=_tower_layers(state, ""),
        num_attention_heads=twidth // arch.text_head_width,
        max_position_embeddings=tpos.shape[0],
        hidden_act=act,
        layer_norm_eps=1e-5,
        # open_clip pools at argmax(token id): the end-of-text token, the last in the vocab
        bos_token_id=vocab - 2,
        eos_token_id=vocab - 1,
        pad_token_id=0,
        projection_dim=proj.shape[1],
    )
    vision = dict(
        hidden_size=vwidth,
        intermediate_size=vfc.shape[0],
        num_hidden_layers=_tower_layers(state, "visual."),
        num_attention_heads=vwidth // arch.vision_head_width,
        image_size=grid * patch,
        patch_size=patch,
        hidden_act=act,
        layer_norm_eps=1e-5,
        projection_dim=proj.shape[1],
    )
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=proj.shape[1])


def _blocks(ledger: TensorLedger, src: str, dst: str, layers: int, width: int, mlp: int, out):
    for i in range(layers):
        s, d = f"{src}{i}.", f"{dst}{i}."
        qkv_w = ledger.take(s + "attn.in_proj_weight", (3 * width, width))
        qkv_b = ledger.take(s + "attn.in_proj_bias", (3 * width,))
        if qkv_w.numel():
            for name, w in zip(("q", "k", "v"), qkv_w.chunk(3, dim=0), strict=True):
                out[f"{d}self_attn.{name}_proj.weight"] = w
        if qkv_b.numel():
            for name, b in zip(("q", "k", "v"), qkv_b.chunk(3, dim=0), strict=True):
                out[f"{d}self_attn.{name}_proj.bias"] = b
        pairs = [
            ("ln_1", "layer_norm1", (width,), None),
            ("attn.out_proj", "self_attn.out_proj", (width,), (width, width)),
            ("ln_2", "layer_norm2", (width,), None),
            ("mlp.c_fc", "mlp.fc1", (mlp,), (mlp, width)),
            ("mlp.c_proj", "mlp.fc2", (width,), (width, mlp)),
        ]
        for a, b, bias_shape, weight_shape in pairs:
            out[f"{d}{b}.weight"] = ledger.take(f"{s}{a}.weight", weight_shape or bias_shape)
            out[f"{d}{b}.bias"] = ledger.take(f"{s}{a}.bias", bias_shape)


def openclip_to_clip(state: dict[str, torch.Tensor], arch: OpenClipArch, what: str = "openclip"):
    """(CLIPConfig, transformers state dict, keys left over) for an OpenCLIP ViT state dict.
    Raises CheckpointMismatch naming missing or mis-shaped tensors."""
    config = clip_config_from_openclip(state, arch, what)
    v, t = config.vision_config, config.text_config
    ledger = TensorLedger(state, what, IGNORABLE)
    out: dict[str, torch.Tensor] = {}
    vw, tw, dim = v.hidden_size, t.hidden_size, config.projection_dim
    tokens = (v.image_size // v.patch_size) ** 2 + 1
    out["vision_model.embeddings.patch_embedding.weight"] = ledger.take(
        "visual.conv1.weight", (vw, 3, v.patch_size, v.patch_size)
    )
    out["vision_model.embeddings.class_embedding"] = ledger.take("visual.class_embedding", (vw,))
    out["vision_model.embeddings.position_embedding.weight"] = ledger.take(
        "visual.positional_embedding", (tokens, vw)
    )
    out["vision_model.pre_layrnorm.weight"] = ledger.take("visual.ln_pre.weight", (vw,))
    out["vision_model.pre_layrnorm.bias"] = ledger.take("visual.ln_pre.bias", (vw,))
    _blocks(
        ledger,
        "visual.transformer.resblocks.",
        "vision_model.encoder.layers.",
        v.num_hidden_layers,
        vw,
        v.intermediate_size,
        out,
    )
    out["vision_model.post_layernorm.weight"] = ledger.take("visual.ln_post.weight", (vw,))
    out["vision_model.post_layernorm.bias"] = ledger.take("visual.ln_post.bias", (vw,))
    out["visual_projection.weight"] = ledger.take("visual.proj", (vw, dim)).t().contiguous()
    out["text_model.embeddings.token_embedding.weight"] = ledger.take(
        "token_embedding.weight", (t.vocab_size, tw)
    )
    out["text_model.embeddings.position_embedding.weight"] = ledger.take(
        "positional_embedding", (t.max_position_embeddings, tw)
    )
    _blocks(
        ledger,
        "transformer.resblocks.",
        "text_model.encoder.layers.",
        t.num_hidden_layers,
        tw,
        t.intermediate_size,
        out,
    )
    out["text_model.final_layer_norm.weight"] = ledger.take("ln_final.weight", (tw,))
    out["text_model.final_layer_norm.bias"] = ledger.take("ln_final.bias", (tw,))
    out["text_projection.weight"] = ledger.take("text_projection", (tw, dim)).t().contiguous()
    out["logit_scale"] = ledger.take("logit_scale", ())
    leftover = ledger.finish()
    return config, out, leftover
