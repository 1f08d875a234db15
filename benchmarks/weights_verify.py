"""``g2rpo bench weights --verify-gb GB``: what verifying one published weight
version costs per GB, at FLUX size on the CPU, without Ray. A synthetic state of at
least GB gigabytes in FLUX.1-dev's block shapes (3072x3072 attention projections and
3072x12288 MLP weights, alternating; float32, then bfloat16) is checksummed by the
method before issue 20 (SHA-256 over a ``tobytes()`` copy of each tensor, kept here
only as that reference) and by ``weights_checksum`` (XXH3-128 over zero-copy views),
in the same run, beside the host copy of the same bytes that the learner makes for
every version anyway (``trained_state``)."""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from ..common.algorithms.flops import best_seconds
from ..common.errors import UsageError
from ..common.wire.weights import state_nbytes, weights_checksum

FLUX_BLOCK_SHAPES = ((3072, 3072), (3072, 12288))
GB = 1e9


def sha256_checksum(state: dict[str, torch.Tensor]) -> str:
    """The published-weight checksum before issue 20, for comparison only."""
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        raw = state[name].detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        h.update(raw.numpy().tobytes())
    return h.hexdigest()[:16]


def flux_like_state(gigabytes: float, dtype: torch.dtype, seed: int = 0) -> dict:
    """Random tensors in FLUX.1-dev's block shapes, alternating, until they hold at
    least ``gigabytes`` GB (written, so no page is first touched while timing)."""
    g = torch.Generator().manual_seed(seed)
    state, nbytes = {}, 0
    while nbytes < gigabytes * GB:
        shape = FLUX_BLOCK_SHAPES[len(state) % len(FLUX_BLOCK_SHAPES)]
        t = torch.randn(shape, generator=g).to(dtype)
        state[f"blocks.{len(state) // 2}.{'mlp' if shape[1] > shape[0] else 'attn'}.weight"] = t
        nbytes += t.numel() * t.element_size()
    return state


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def bench_verification(gigabytes: float = 1.0, repeats: int = 3) -> dict[str, Any]:
    if gigabytes <= 0:
        raise UsageError(f"--verify-gb {gigabytes}: must be > 0")
    if repeats < 1:
        raise UsageError(f"--repeats {repeats}: must be >= 1")
    out: dict[str, Any] = {
        "settings": {
            "verify_gb": gigabytes,
            "repeats": repeats,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        }
    }
    for dtype in (torch.float32, torch.bfloat16):
        state = flux_like_state(gigabytes, dtype)
        size = state_nbytes(state) / GB
        sha_s = best_seconds(lambda state=state: sha256_checksum(state), repeats)
        xxh_s = best_seconds(lambda state=state: weights_checksum(state), repeats)
        copy_s = best_seconds(lambda state=state: {k: v.clone() for k, v in state.items()}, repeats)
        out[str(dtype).removeprefix("torch.")] = {
            "bytes": state_nbytes(state),
            "tensors": len(state),
            "sha256_s_per_gb": _sig(sha_s / size),
            "xxh3_s_per_gb": _sig(xxh_s / size),
            "host_copy_s_per_gb": _sig(copy_s / size),
            "sha256_vs_xxh3": _sig(sha_s / xxh_s),
            "xxh3_vs_host_copy": _sig(xxh_s / copy_s),
        }
        del state
    return out
