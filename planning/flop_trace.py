"""FLOPs of the models a run calls, counted on fake tensors.

The same fake-tensor builds as the memory traces (``trace.py``), under torch's flop
counter instead of its memory tracker: no weights, no arithmetic, only shapes. The
transformer's count is exact in its depth (each block adds the same FLOPs), so it is
counted at three small depths and solved for the full depth (FLUX.1-dev's 19 + 38
blocks, SD3.5-Medium's 24 layers, 13 of them with dual attention), as the activation
traces are. Results go through the same cache and shipped table.
"""

from __future__ import annotations

import torch

from ..common.algorithms.flops import count_cpu_attention
from . import trace
from .trace import (
    build_at,
    cached,
    default_dtype,
    depth_variants,
    guided_cond,
    solve_depth,
    transformer_inputs,
    velocity_of,
)

# A scorer's forward per image, FLOPs: 2 x the parameters each token passes through x the
# tokens (ViT-H-14 at 224²: 257 tokens through 632M vision parameters, plus the prompt's 77
# through the 354M text tower); BLIP ViT-L for ImageReward. A formula, not a count.
SCORER_FLOPS = {
    "hpsv2": 2 * (632e6 * 257 + 354e6 * 77),
    "pickscore": 2 * (632e6 * 257 + 354e6 * 77),
    "clip_score": 2 * (632e6 * 257 + 354e6 * 77),
    "image_reward": 2 * (303e6 * 577 + 110e6 * 35),
}


def _counted(fn) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    count_cpu_attention()
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def _transformer_once(
    config: dict, depth: dict, latent_hw, text_tokens, guided: bool = False
) -> int:
    with trace._fake_mode():
        with default_dtype(torch.bfloat16):
            model = build_at(config, depth)
        model.requires_grad_(False).eval()
        velocity = velocity_of(model, config, latent_hw, None, guided)
        x, t, cond = transformer_inputs(config, 1, latent_hw, text_tokens)
        if guided:
            cond = guided_cond(cond)
        with torch.no_grad():
            return _counted(lambda: velocity(x, t, cond))


def transformer_flops(
    config: dict, latent_hw: tuple[int, int], text_tokens: int, guided: bool = False
) -> int:
    """FLOPs of one sample's transformer forward (one NFE) at the config's depth; an
    SD3 call with classifier-free guidance (``guided``) runs the model on two rows."""
    arch = {k: v for k, v in config.items() if not k.startswith("_")}

    def compute() -> dict:
        counts = [
            _transformer_once(arch, d, latent_hw, text_tokens, guided) for d in depth_variants(arch)
        ]
        return {"flops": solve_depth(counts, arch)["bytes"]}

    key = {"arch": arch, "latent_hw": list(latent_hw), "text_tokens": text_tokens}
    if guided:
        key["guided"] = True
    return int(cached("transformer-flops", key, compute)["flops"])


def vae_decode_flops(vae_config: dict, latent_hw: tuple[int, int]) -> int:
    """FLOPs of decoding one image."""
    arch = {k: v for k, v in vae_config.items() if not k.startswith("_")}

    def compute() -> dict:
        with trace._fake_mode():
            vae, z = trace.vae_and_latent(arch, latent_hw)
            with torch.no_grad():
                return {"flops": _counted(lambda: vae.decode(z, return_dict=False))}

    return int(cached("vae-flops", {"arch": arch, "latent_hw": list(latent_hw)}, compute)["flops"])
