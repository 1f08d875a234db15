"""The scorer interface and input checks shared by every scorer."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


class BadInput(ValueError):
    """Input rejected by a scorer; the message names the field."""


@runtime_checkable
class Scorer(Protocol):
    name: str
    version: str

    def score(self, images: np.ndarray, prompts: list[str]) -> np.ndarray:
        """images: uint8 [N, H, W, 3]; prompts: N strings. Returns float32 [N]."""
        ...


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
