"""The scorer interface and input checks shared by every scorer."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from ...common.errors import UsageError


class BadInput(ValueError):
    """Input rejected by a scorer; the message names the field."""


@runtime_checkable
class Scorer(Protocol):
    name: str
    version: str

    def score(self, images: np.ndarray, prompts: list[str]) -> np.ndarray:
        """images: uint8 [N, H, W, 3]; prompts: N strings. Returns float32 [N]."""
        ...


@runtime_checkable
class Embedder(Protocol):
    """A scorer with an image tower: its L2-normalised image features. Optional: a scorer
    without one (jpeg, the shapes oracle) has no ``embed``; ``can_embed`` tells them apart."""

    name: str

    def embed(self, images: np.ndarray) -> np.ndarray:
        """images: uint8 [N, H, W, 3]. Returns float32 [N, D], each row of unit norm."""
        ...


def can_embed(scorer) -> bool:
    return isinstance(scorer, Embedder)


def check_images(images) -> np.ndarray:
    """Validate an image batch (no prompts); returns it as uint8 [N, H, W, 3]."""
    arr = np.asarray(images)
    return check_batch(arr, [""] * (arr.shape[0] if arr.ndim == 4 else 0))


def check_batch(images, prompts: list[str]) -> np.ndarray:
    """Validate a batch; returns the images as a uint8 numpy array [N, H, W, 3]."""
    arr = np.asarray(images)
    if arr.dtype != np.uint8:
        raise BadInput(f"images: dtype must be uint8, got {arr.dtype}")
    if arr.ndim != 4 or arr.shape[-1] != 3:
        raise BadInput(f"images: shape must be [N, H, W, 3], got {list(arr.shape)}")
    if not isinstance(prompts, list | tuple) or not all(isinstance(p, str) for p in prompts):
        raise BadInput("prompts: must be a list of strings")
    if len(prompts) != arr.shape[0]:
        raise BadInput(f"prompts: {len(prompts)} prompts for {arr.shape[0]} images")
    return arr


def torch_dtype(name: str, device: str):
    """``auto``: bfloat16 on CUDA (the scorers' throughput on a GPU), float32 elsewhere."""
    import torch

    if name == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if name not in ("float32", "bfloat16", "float16"):
        raise UsageError(f"dtype must be auto, float32, bfloat16 or float16, got {name!r}")
    return getattr(torch, name)


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def weights_version(local) -> str:
    """``<dir name>-<12 hex>``: a sha256 over the directory's config and weight files, so
    the score cache never serves one checkpoint's scores for another's."""
    import hashlib
    from pathlib import Path

    local = Path(local)
    digest = hashlib.sha256()
    files = sorted(
        p for p in local.iterdir() if p.name == "config.json" or p.suffix in _WEIGHT_SUFFIXES
    )
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return f"{local.name}-{digest.hexdigest()[:12]}"
