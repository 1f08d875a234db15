"""``shapes_oracle``: an exact analytic check of a shapes-world image against its prompt.

Background = median of the border pixels snapped to the palette; foreground mask =
pixels further than 60 (RGB L2) from it; foreground colour = median of the half of
the mask furthest from the background, snapped; shape = the template with the best
IoU after cropping the mask to a square box around its bounding box and resampling
to 16×16 (templates go through the same crop). Score = fraction of the three
criteria met, in [0, 1]; a prompt passes when all three are. ``shapes_strict`` scores
that pass alone (1 or 0): the world's sparse reward.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image

from ...common.prompts.shapes import PALETTE, SHAPES, parse_prompt, shape_mask
from .base import BadInput, check_batch

_NAMES = list(PALETTE)
_RGB = np.array([PALETTE[n] for n in _NAMES], dtype=np.float64)
FG_DISTANCE = 60.0
GRID = 16


@dataclass(frozen=True)
class Check:
    bg: str
    fg: str | None
    shape: str | None
    bg_ok: bool
    fg_ok: bool
    shape_ok: bool

    @property
    def passed(self) -> bool:
        return self.bg_ok and self.fg_ok and self.shape_ok

    @property
    def score(self) -> float:
        return (self.bg_ok + self.fg_ok + self.shape_ok) / 3.0


def _snap(rgb: np.ndarray) -> str:
    return _NAMES[int(np.argmin(((_RGB - rgb) ** 2).sum(axis=1)))]


def _normalise(mask: np.ndarray) -> np.ndarray | None:
    """Crop to a square box centred on the bounding box, resample to GRID×GRID."""
    rows, cols = np.nonzero(mask)
    if rows.size == 0:
        return None
    cy, cx = (rows.min() + rows.max() + 1) / 2.0, (cols.min() + cols.max() + 1) / 2.0
    side = max(rows.max() - rows.min() + 1, cols.max() - cols.min() + 1)
    top, left = round(cy - side / 2.0), round(cx - side / 2.0)
    box = np.zeros((side, side), dtype=np.uint8)
    src = mask[max(top, 0) : top + side, max(left, 0) : left + side]
    box[
        max(-top, 0) : max(-top, 0) + src.shape[0], max(-left, 0) : max(-left, 0) + src.shape[1]
    ] = src * 255
    small = Image.fromarray(box).resize((GRID, GRID), Image.BOX)
    return np.asarray(small) >= 128


@lru_cache(maxsize=1)
def _templates() -> dict[str, np.ndarray]:
    size = 256
    return {s: _normalise(shape_mask(s, size, size / 2, size / 2, 0.35 * size)) for s in SHAPES}


def classify_shape(mask: np.ndarray) -> str | None:
    norm = _normalise(mask)
    if norm is None:
        return None
    best, best_iou = None, -1.0
    for name, tmpl in _templates().items():
        iou = (norm & tmpl).sum() / max((norm | tmpl).sum(), 1)
        if iou > best_iou:
            best, best_iou = name, iou
    return best


def check_image(image: np.ndarray, prompt: str) -> Check:
    """Check one uint8 [H, W, 3] image against its shapes-world prompt."""
    try:
        want = parse_prompt(prompt)
    except ValueError as exc:
        raise BadInput(f"prompts: {exc}") from None
    px = image.astype(np.float64)
    border = np.concatenate([px[0], px[-1], px[1:-1, 0], px[1:-1, -1]])
    bg_rgb = np.median(border, axis=0)
    bg = _snap(bg_rgb)
    dist = np.sqrt(((px - bg_rgb) ** 2).sum(axis=-1))
    mask = dist > FG_DISTANCE
    fg = shape = None
    if mask.any():
        far = dist[mask]
        strong = px[mask][far >= np.median(far)]
        fg = _snap(np.median(strong, axis=0))
        shape = classify_shape(mask)
    return Check(
        bg=bg,
        fg=fg,
        shape=shape,
        bg_ok=bg == want.bg,
        fg_ok=fg == want.fg,
        shape_ok=shape == want.shape,
    )


class ShapesOracle:
    name = "shapes_oracle"
    version = "1"

    def score(self, images, prompts: list[str]) -> np.ndarray:
        arr = check_batch(images, prompts)
        return np.array(
            [check_image(img, p).score for img, p in zip(arr, prompts, strict=True)],
            dtype=np.float32,
        )

    def checks(self, images, prompts: list[str]) -> list[Check]:
        arr = check_batch(images, prompts)
        return [check_image(img, p) for img, p in zip(arr, prompts, strict=True)]


class ShapesStrict(ShapesOracle):
    """The checker's strict pass as a reward: 1.0 when background, colour and shape all
    match the prompt, else 0.0 (sparse: most groups early in training are all 0)."""

    name = "shapes_strict"

    def score(self, images, prompts: list[str]) -> np.ndarray:
        return np.array([c.passed for c in self.checks(images, prompts)], dtype=np.float32)
