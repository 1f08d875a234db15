"""Tiny random reward checkpoints in the ORIGINAL key layouts (OpenCLIP as HPS-v2.1 and
DFN5B ship it; ImageReward's BLIP + MLP), tokenizers for them, and independent
plain-torch forwards of the original architectures written from their published
descriptions — the known answers the converted transformers models must match."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
STD = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)

# tiny towers whose widths fit the ViT-H-14 presets' head widths (80 vision, 64 text)
CLIP_VISION = dict(width=160, layers=2, patch=8, image=32, mlp=320)
CLIP_TEXT = dict(width=128, layers=2, context=77, mlp=256)
CLIP_EMBED = 48


def _rand(*shape, scale=0.05):
    return torch.randn(*shape) * scale


def _ln(prefix: str, width: int) -> dict:
    return {prefix + ".weight": 1 + _rand(width), prefix + ".bias": _rand(width)}


def _resblocks(prefix: str, width: int, layers: int, mlp: int) -> dict:
    sd = {}
    for i in range(layers):
        p = f"{prefix}transformer.resblocks.{i}."
        sd |= _ln(p + "ln_1", width) | _ln(p + "ln_2", width)
        sd[p + "attn.in_proj_weight"] = _rand(3 * width, width, scale=width**-0.5)
        sd[p + "attn.in_proj_bias"] = _rand(3 * width)
        sd[p + "attn.out_proj.weight"] = _rand(width, width, scale=width**-0.5)
        sd[p + "attn.out_proj.bias"] = _rand(width)
        sd[p + "mlp.c_fc.weight"] = _rand(mlp, width, scale=width**-0.5)
        sd[p + "mlp.c_fc.bias"] = _rand(mlp)
        sd[p + "mlp.c_proj.weight"] = _rand(width, mlp, scale=mlp**-0.5)
        sd[p + "mlp.c_proj.bias"] = _rand(width)
    return sd


def openclip_state_dict(seed: int = 0, vocab: int = 514) -> dict[str, torch.Tensor]:
    """open_clip's VisionTransformer + text tower keys (CLIP model, not CustomText)."""
    torch.manual_seed(seed)
    v, t = CLIP_VISION, CLIP_TEXT
    vw, tw, grid = v["width"], t["width"], v["image"] // v["patch"]
    sd = {
        "visual.conv1.weight": _rand(vw, 3, v["patch"], v["patch"], scale=0.1),
        "visual.class_embedding": _rand(vw, scale=0.5),
        "visual.positional_embedding": _rand(grid * grid + 1, vw, scale=0.5),
        "visual.proj": _rand(vw, CLIP_EMBED, scale=vw**-0.5),
        "token_embedding.weight": _rand(vocab, tw, scale=0.5),
        "positional_embedding": _rand(t["context"], tw, scale=0.1),
        "text_projection": _rand(tw, CLIP_EMBED, scale=tw**-0.5),
        "logit_scale": torch.tensor(math.log(1 / 0.07)),
        # the causal-mask buffer older open_clip versions saved: no weights in it
        "attn_mask": torch.full((t["context"], t["context"]), float("-inf")).triu(1),
    }
    sd |= _ln("visual.ln_pre", vw) | _ln("visual.ln_post", vw) | _ln("ln_final", tw)
    sd |= _resblocks("visual.", vw, v["layers"], v["mlp"])
    sd |= _resblocks("", tw, t["layers"], t["mlp"])
    return sd


def _gelu(x, quick: bool):
    return x * torch.sigmoid(1.702 * x) if quick else F.gelu(x)


def _openclip_block(x, sd, p, heads, quick, mask=None):
    """open_clip's ResidualAttentionBlock: x + attn(ln_1 x); x + mlp(ln_2 x)."""
    width = x.shape[-1]
    h = F.layer_norm(x, (width,), sd[p + "ln_1.weight"], sd[p + "ln_1.bias"], 1e-5)
    q, k, v = F.linear(h, sd[p + "attn.in_proj_weight"], sd[p + "attn.in_proj_bias"]).chunk(3, -1)
    n, L, _ = q.shape

    def split(z):
        return z.view(n, L, heads, width // heads).transpose(1, 2)

    att = (split(q) @ split(k).transpose(-1, -2)) / math.sqrt(width // heads)
    if mask is not None:
        att = att + mask
    o = (att.softmax(-1) @ split(v)).transpose(1, 2).reshape(n, L, width)
    x = x + F.linear(o, sd[p + "attn.out_proj.weight"], sd[p + "attn.out_proj.bias"])
    h = F.layer_norm(x, (width,), sd[p + "ln_2.weight"], sd[p + "ln_2.bias"], 1e-5)
    h = _gelu(F.linear(h, sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"]), quick)
    return x + F.linear(h, sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"])


def openclip_image_features(sd, pixels, heads=2, quick=False):
    v = CLIP_VISION
    x = F.conv2d(pixels, sd["visual.conv1.weight"], stride=v["patch"])  # [N, W, g, g]
    x = x.flatten(2).transpose(1, 2)
    cls = sd["visual.class_embedding"].expand(x.shape[0], 1, -1)
    x = torch.cat([cls, x], dim=1) + sd["visual.positional_embedding"]
    x = F.layer_norm(x, (v["width"],), sd["visual.ln_pre.weight"], sd["visual.ln_pre.bias"], 1e-5)
    for i in range(v["layers"]):
        x = _openclip_block(x, sd, f"visual.transformer.resblocks.{i}.", heads, quick)
    x = F.layer_norm(
        x[:, 0], (v["width"],), sd["visual.ln_post.weight"], sd["visual.ln_post.bias"], 1e-5
    )
    return x @ sd["visual.proj"]


def openclip_tokens(tokenizer, prompts, context=77):
    """open_clip.tokenize: [sot] + BPE ids + [eot], truncated to the context with eot
    kept last, zero-padded."""
    sot, eot = tokenizer.convert_tokens_to_ids(["<|startoftext|>", "<|endoftext|>"])
    out = torch.zeros(len(prompts), context, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids = [sot, *tokenizer(p, add_special_tokens=False)["input_ids"], eot]
        if len(ids) > context:
            ids = ids[:context]
            ids[-1] = eot
        out[i, : len(ids)] = torch.tensor(ids)
    return out


def openclip_text_features(sd, ids, heads=2, quick=False):
    t = CLIP_TEXT
    L = ids.shape[1]
    x = sd["token_embedding.weight"][ids] + sd["positional_embedding"][:L]
    causal = torch.full((L, L), float("-inf")).triu(1)
    for i in range(t["layers"]):
        x = _openclip_block(x, sd, f"transformer.resblocks.{i}.", heads, quick, causal)
    x = F.layer_norm(x, (t["width"],), sd["ln_final.weight"], sd["ln_final.bias"], 1e-5)
    return x[torch.arange(ids.shape[0]), ids.argmax(dim=-1)] @ sd["text_projection"]


def openclip_preprocess(images, size):
    """open_clip's eval transform on uint8 HWC arrays: PIL bicubic resize of the
    shortest side, centre crop with torchvision's rounding, ToTensor, Normalize."""
    import numpy as np
    from PIL import Image

    out = []
    for arr in images:
        img = Image.fromarray(arr)
        w, h = img.size
        short, long = (w, h) if w <= h else (h, w)
        new_long = int(size * long / short)
        img = img.resize((size, new_long) if w <= h else (new_long, size), Image.BICUBIC)
        w, h = img.size
        top, left = round((h - size) / 2.0), round((w - size) / 2.0)
        img = img.crop((left, top, left + size, top + size))
        out.append(torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float() / 255)
    return (torch.stack(out) - MEAN) / STD


# ---- ImageReward (BLIP ViT + BERT with cross-attention + MLP) -------------------

IR_VISION = dict(width=128, layers=2, patch=8, image=32, mlp=256)
IR_TEXT = dict(width=128, layers=2, positions=40, mlp=256)
IR_HEAD = (1024, 128, 64, 16, 1)
IR_EMBED = 32
BERT_WORDS = [
    *("a", "an", "the", "red", "green", "blue", "yellow", "white", "black", "purple"),
    *("orange", "circle", "square", "triangle", "star", "cross", "on", "background"),
    *("of", "with", "and", "in", "photo", "picture"),
]


def tiny_bert_tokenizer():
    from transformers import BertTokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *BERT_WORDS]
    vocab += [chr(c) for c in range(ord("a"), ord("z") + 1)] + [
        "##" + chr(c) for c in range(97, 123)
    ]
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n")
    return BertTokenizer(str(path), do_lower_case=True)


def image_reward_state_dict(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """ImageReward.pt's layout: ``blip.visual_encoder`` (BLIP vit.py), ``blip.text_encoder``
    (BLIP med.py BertModel, cross-attention in every layer), projections, ``mlp.layers``."""
    torch.manual_seed(seed)
    v, t = IR_VISION, IR_TEXT
    vw, tw, grid = v["width"], t["width"], v["image"] // v["patch"]
    ve, te = "blip.visual_encoder.", "blip.text_encoder."
    sd = {
        ve + "cls_token": _rand(1, 1, vw, scale=0.5),
        ve + "pos_embed": _rand(1, grid * grid + 1, vw, scale=0.5),
        ve + "patch_embed.proj.weight": _rand(vw, 3, v["patch"], v["patch"], scale=0.1),
        ve + "patch_embed.proj.bias": _rand(vw),
        te + "embeddings.word_embeddings.weight": _rand(vocab, tw, scale=0.5),
        te + "embeddings.position_embeddings.weight": _rand(t["positions"], tw, scale=0.1),
        te + "embeddings.position_ids": torch.arange(t["positions"]).unsqueeze(0),
        "blip.vision_proj.weight": _rand(IR_EMBED, vw),
        "blip.vision_proj.bias": _rand(IR_EMBED),
        "blip.text_proj.weight": _rand(IR_EMBED, tw),
        "blip.text_proj.bias": _rand(IR_EMBED),
    }
    sd |= _ln(ve + "norm", vw) | _ln(te + "embeddings.LayerNorm", tw)
    for i in range(v["layers"]):
        p = f"{ve}blocks.{i}."
        sd |= _ln(p + "norm1", vw) | _ln(p + "norm2", vw)
        for name, (o, n) in {
            "attn.qkv": (3 * vw, vw),
            "attn.proj": (vw, vw),
            "mlp.fc1": (v["mlp"], vw),
            "mlp.fc2": (vw, v["mlp"]),
        }.items():
            sd[p + name + ".weight"] = _rand(o, n, scale=n**-0.5)
            sd[p + name + ".bias"] = _rand(o)
    for i in range(t["layers"]):
        p = f"{te}encoder.layer.{i}."
        for name, (o, n) in {
            "attention.self.query": (tw, tw),
            "attention.self.key": (tw, tw),
            "attention.self.value": (tw, tw),
            "attention.output.dense": (tw, tw),
            "crossattention.self.query": (tw, tw),
            "crossattention.self.key": (tw, vw),
            "crossattention.self.value": (tw, vw),
            "crossattention.output.dense": (tw, tw),
            "intermediate.dense": (t["mlp"], tw),
            "output.dense": (tw, t["mlp"]),
        }.items():
            sd[p + name + ".weight"] = _rand(o, n, scale=n**-0.5)
            sd[p + name + ".bias"] = _rand(o)
        for ln in (
            "attention.output.LayerNorm",
            "crossattention.output.LayerNorm",
            "output.LayerNorm",
        ):
            sd |= _ln(p + ln, tw)
    width = tw
    for index, out in zip((0, 2, 4, 6, 7), IR_HEAD, strict=True):
        sd[f"mlp.layers.{index}.weight"] = _rand(out, width, scale=width**-0.5)
        sd[f"mlp.layers.{index}.bias"] = _rand(out)
        width = out
    return sd


def _heads_attention(q, k, v, heads, mask=None):
    n, L, w = q.shape
    S = k.shape[1]
    qh = q.view(n, L, heads, w // heads).transpose(1, 2)
    kh = k.view(n, S, heads, w // heads).transpose(1, 2)
    vh = v.view(n, S, heads, w // heads).transpose(1, 2)
    att = qh @ kh.transpose(-1, -2) / math.sqrt(w // heads)
    if mask is not None:
        att = att + mask
    return (att.softmax(-1) @ vh).transpose(1, 2).reshape(n, L, w)


def _layers(sd, eps):
    """LayerNorm and Linear over the state dict's ``<prefix>.weight/.bias``."""

    def ln(x, p):
        return F.layer_norm(x, x.shape[-1:], sd[p + ".weight"], sd[p + ".bias"], eps)

    def lin(x, p):
        return F.linear(x, sd[p + ".weight"], sd[p + ".bias"])

    return ln, lin


def blip_vit(sd, pixels, heads=2):
    """BLIP's vit.py VisionTransformer (timm blocks, LayerNorm eps 1e-6)."""
    v, ve = IR_VISION, "blip.visual_encoder."
    ln, lin = _layers(sd, 1e-6)

    x = F.conv2d(
        pixels,
        sd[ve + "patch_embed.proj.weight"],
        sd[ve + "patch_embed.proj.bias"],
        stride=v["patch"],
    )
    x = x.flatten(2).transpose(1, 2)
    x = (
        torch.cat([sd[ve + "cls_token"].expand(x.shape[0], -1, -1), x], dim=1)
        + sd[ve + "pos_embed"]
    )
    for i in range(v["layers"]):
        p = f"{ve}blocks.{i}."
        q, k, val = lin(ln(x, p + "norm1"), p + "attn.qkv").chunk(3, dim=-1)
        x = x + lin(_heads_attention(q, k, val, heads), p + "attn.proj")
        x = x + lin(F.gelu(lin(ln(x, p + "norm2"), p + "mlp.fc1")), p + "mlp.fc2")
    return ln(x, ve + "norm")


def blip_bert_cls(sd, ids, mask, image_embeds, heads=2):
    """BLIP's med.py BertModel as ImageReward runs it: bidirectional self-attention
    over the prompt (padding masked with −10000), cross-attention to every image
    token, post-LN residual blocks (eps 1e-12); returns the [CLS] state."""
    t, te = IR_TEXT, "blip.text_encoder."
    ln, lin = _layers(sd, 1e-12)

    L = ids.shape[1]
    x = sd[te + "embeddings.word_embeddings.weight"][ids]
    x = ln(x + sd[te + "embeddings.position_embeddings.weight"][:L], te + "embeddings.LayerNorm")
    pad = (1.0 - mask[:, None, None, :].float()) * -10000.0
    for i in range(t["layers"]):
        p = f"{te}encoder.layer.{i}."
        a = _heads_attention(
            lin(x, p + "attention.self.query"),
            lin(x, p + "attention.self.key"),
            lin(x, p + "attention.self.value"),
            heads,
            pad,
        )
        x = ln(lin(a, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        c = _heads_attention(
            lin(x, p + "crossattention.self.query"),
            lin(image_embeds, p + "crossattention.self.key"),
            lin(image_embeds, p + "crossattention.self.value"),
            heads,
        )
        x = ln(lin(c, p + "crossattention.output.dense") + x, p + "crossattention.output.LayerNorm")
        h = F.gelu(lin(x, p + "intermediate.dense"))
        x = ln(lin(h, p + "output.dense") + x, p + "output.LayerNorm")
    return x[:, 0]


def image_reward_reference(sd, pixels, ids, mask):
    cls = blip_bert_cls(sd, ids, mask, blip_vit(sd, pixels))
    for index in (0, 2, 4, 6, 7):  # Linear layers only: the Dropouts are identities at eval
        cls = F.linear(cls, sd[f"mlp.layers.{index}.weight"], sd[f"mlp.layers.{index}.bias"])
    return (cls.squeeze(-1) - 0.16717362830052426) / 1.0333394966054072


def bert_tokens(tokenizer, prompts, max_length=35):
    """BLIP's tokenizer call in ImageReward: [CLS] pieces [SEP], truncated and padded to 35."""
    cls, sep = tokenizer.convert_tokens_to_ids(["[CLS]", "[SEP]"])
    ids = torch.zeros(len(prompts), max_length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        pieces = tokenizer(p, add_special_tokens=False)["input_ids"][: max_length - 2]
        row = [cls, *pieces, sep]
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask
