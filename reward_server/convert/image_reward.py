"""``ImageReward.pt`` (THUDM) → ``ImageRewardModel`` (transformers BLIP modules).

The original is BLIP's ``BLIP_Pretrain`` under ``blip.`` plus the reward MLP under
``mlp.``: a timm-style ViT (``visual_encoder``: fused ``qkv``, ``proj``, ``norm1/2``),
BLIP's med.py BERT (``text_encoder``: the same module names as transformers'
``BlipTextModel``) and the contrastive projections. Widths and depths are read from
the shapes; heads are 64 wide in both towers (ViT-L/16: 16, BERT-base: 12).
"""

from __future__ import annotations

import math

import torch

from ..scorers.image_reward_model import HEAD_WIDTHS, ImageRewardConfig
from .checkpoint import CheckpointMismatch, TensorLedger, require

IGNORABLE = ("position_ids",)
_MLP_INDEX = (0, 2, 4, 6, 7)  # the Linear layers of ImageReward's MLP (Dropouts between)


def image_reward_config(state: dict[str, torch.Tensor], head_width: int, what: str):
    patch = require(state, "blip.visual_encoder.patch_embed.proj.weight", what)
    pos = require(state, "blip.visual_encoder.pos_embed", what)
    vfc = require(state, "blip.visual_encoder.blocks.0.mlp.fc1.weight", what)
    words = require(state, "blip.text_encoder.embeddings.word_embeddings.weight", what)
    tpos = require(state, "blip.text_encoder.embeddings.position_embeddings.weight", what)
    tfc = require(state, "blip.text_encoder.encoder.layer.0.intermediate.dense.weight", what)
    vproj = require(state, "blip.vision_proj.weight", what)
    vwidth, size = patch.shape[0], patch.shape[-1]
    grid = math.isqrt(pos.shape[1] - 1)
    twidth = words.shape[1]
    for width in (vwidth, twidth):
        if width % head_width:
            raise CheckpointMismatch(f"{what}: head width {head_width} does not divide {width}")
    ledger = TensorLedger(state, what)
    vision = dict(
        hidden_size=vwidth,
        intermediate_size=vfc.shape[0],
        num_hidden_layers=ledger.count("blip.visual_encoder.blocks.", ".norm1.weight"),
        num_attention_heads=vwidth // head_width,
        image_size=grid * size,
        patch_size=size,
        layer_norm_eps=1e-6,  # timm ViT's LayerNorm in BLIP
        hidden_act="gelu",
    )
    text = dict(
        vocab_size=words.shape[0],
        hidden_size=twidth,
        encoder_hidden_size=vwidth,
        intermediate_size=tfc.shape[0],
        num_hidden_layers=ledger.count("blip.text_encoder.encoder.layer.", ".output.dense.weight"),
        num_attention_heads=twidth // head_width,
        max_position_embeddings=tpos.shape[0],
        layer_norm_eps=1e-12,
        hidden_act="gelu",
        pad_token_id=0,
    )
    keys = [f"mlp.layers.{i}.weight" for i in _MLP_INDEX]
    head = [state[k].shape[0] for k in keys if k in state]
    return ImageRewardConfig(
        vision_config=vision,
        text_config=text,
        embed_dim=vproj.shape[0],
        head_widths=head if len(head) == len(HEAD_WIDTHS) else list(HEAD_WIDTHS),
    )


def image_reward_to_transformers(
    state: dict[str, torch.Tensor], head_width: int = 64, what: str = "image_reward"
):
    """(ImageRewardConfig, state dict for ImageRewardModel, keys left over)."""
    config = image_reward_config(state, head_width, what)
    v, t = config.vision_config, config.text_config
    vw, tw = v["hidden_size"], t["hidden_size"]
    vm, tm = v["intermediate_size"], t["intermediate_size"]
    ledger = TensorLedger(state, what, IGNORABLE)
    out: dict[str, torch.Tensor] = {}
    tokens = (v["image_size"] // v["patch_size"]) ** 2 + 1
    p = v["patch_size"]
    ve, vo = "blip.visual_encoder.", "vision_model."
    out[vo + "embeddings.class_embedding"] = ledger.take(ve + "cls_token", (1, 1, vw))
    out[vo + "embeddings.position_embedding"] = ledger.take(ve + "pos_embed", (1, tokens, vw))
    patch = ve + "patch_embed.proj."
    out[vo + "embeddings.patch_embedding.weight"] = ledger.take(patch + "weight", (vw, 3, p, p))
    out[vo + "embeddings.patch_embedding.bias"] = ledger.take(patch + "bias", (vw,))
    vision_pairs = [
        ("norm1", "layer_norm1", (vw,), (vw,)),
        ("attn.qkv", "self_attn.qkv", (3 * vw, vw), (3 * vw,)),
        ("attn.proj", "self_attn.projection", (vw, vw), (vw,)),
        ("norm2", "layer_norm2", (vw,), (vw,)),
        ("mlp.fc1", "mlp.fc1", (vm, vw), (vm,)),
        ("mlp.fc2", "mlp.fc2", (vw, vm), (vw,)),
    ]
    for i in range(v["num_hidden_layers"]):
        for a, b, w, bias in vision_pairs:
            out[f"{vo}encoder.layers.{i}.{b}.weight"] = ledger.take(f"{ve}blocks.{i}.{a}.weight", w)
            out[f"{vo}encoder.layers.{i}.{b}.bias"] = ledger.take(f"{ve}blocks.{i}.{a}.bias", bias)
    out[vo + "post_layernorm.weight"] = ledger.take(ve + "norm.weight", (vw,))
    out[vo + "post_layernorm.bias"] = ledger.take(ve + "norm.bias", (vw,))
    # the text encoder has transformers' module names already (BlipTextModel is a
    # port of BLIP's med.py): the mapping is the prefix, the shapes are checked
    te = "blip.text_encoder."
    text_shapes = {
        "embeddings.word_embeddings.weight": (t["vocab_size"], tw),
        "embeddings.position_embeddings.weight": (t["max_position_embeddings"], tw),
        "embeddings.LayerNorm.weight": (tw,),
        "embeddings.LayerNorm.bias": (tw,),
    }
    layer_shapes = {
        "attention.self.query": (tw, tw),
        "attention.self.key": (tw, tw),
        "attention.self.value": (tw, tw),
        "attention.output.dense": (tw, tw),
        "attention.output.LayerNorm": (tw,),
        "crossattention.self.query": (tw, tw),
        "crossattention.self.key": (tw, vw),
        "crossattention.self.value": (tw, vw),
        "crossattention.output.dense": (tw, tw),
        "crossattention.output.LayerNorm": (tw,),
        "intermediate.dense": (tm, tw),
        "output.dense": (tw, tm),
        "output.LayerNorm": (tw,),
    }
    for i in range(t["num_hidden_layers"]):
        for name, shape in layer_shapes.items():
            text_shapes[f"encoder.layer.{i}.{name}.weight"] = shape
            text_shapes[f"encoder.layer.{i}.{name}.bias"] = (shape[0],)
    for name, shape in text_shapes.items():
        out["text_encoder." + name] = ledger.take(te + name, shape)
    dim = config.embed_dim
    for proj, width in (("vision_proj", vw), ("text_proj", tw)):
        out[f"{proj}.weight"] = ledger.take(f"blip.{proj}.weight", (dim, width))
        out[f"{proj}.bias"] = ledger.take(f"blip.{proj}.bias", (dim,))
    width = tw
    for index, out_width in zip(_MLP_INDEX, config.head_widths, strict=True):
        out[f"head.{index}.weight"] = ledger.take(f"mlp.layers.{index}.weight", (out_width, width))
        out[f"head.{index}.bias"] = ledger.take(f"mlp.layers.{index}.bias", (out_width,))
        width = out_width
    leftover = ledger.finish()
    return config, out, leftover
