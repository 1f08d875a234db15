"""The offline shapes world: one coloured shape on a coloured background, with its prompt.

Deterministic from a seed. 5 shapes × 8 colours × 7 backgrounds = 280 prompt
combinations; a seeded subset is held out of training (out-of-domain evaluation).
Images are drawn at 4× supersampling and box-downsampled, which anti-aliases edges.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "cross", "diamond")
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 215, 40),
    "purple": (140, 60, 180),
    "orange": (245, 140, 30),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
COLOURS: tuple[str, ...] = tuple(PALETTE)
CROSS_ARM = 0.33
# Part of the world's definition: which combinations are held out of training.
SPLIT_SEED = 0
HELD_OUT = 40  # arm half-width as a fraction of the half-extent
_PROMPT = re.compile(r"^an? (\w+) (\w+) on an? (\w+) background$")


@dataclass(frozen=True, order=True)
class ShapeSpec:
    shape: str
    fg: str
    bg: str

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"shape must be one of {SHAPES}, got {self.shape!r}")
        for field, colour in (("fg", self.fg), ("bg", self.bg)):
            if colour not in PALETTE:
                raise ValueError(f"{field} colour must be one of {COLOURS}, got {colour!r}")
        if self.fg == self.bg:
            raise ValueError(f"foreground and background are both {self.fg!r}")

    @property
    def prompt(self) -> str:
        return f"a {self.fg} {self.shape} on a {self.bg} background"


def parse_prompt(prompt: str) -> ShapeSpec:
    """Inverse of ShapeSpec.prompt; a clear error for anything else."""
    m = _PROMPT.match(prompt.strip().lower())
    if m is None:
        raise ValueError(f"not a shapes-world prompt: {prompt!r}")
    fg, shape, bg = m.groups()
    return ShapeSpec(shape=shape, fg=fg, bg=bg)


def all_combinations() -> list[ShapeSpec]:
    return [
        ShapeSpec(shape, fg, bg) for shape in SHAPES for fg in COLOURS for bg in COLOURS if fg != bg
    ]


def split_combinations(
    seed: int = SPLIT_SEED, held_out: int = HELD_OUT
) -> tuple[list[ShapeSpec], list[ShapeSpec]]:
    """(train, held_out) combinations; the held-out prompts never appear in training."""
    combos = all_combinations()
    order = np.random.default_rng(seed).permutation(len(combos))
    held = sorted(combos[i] for i in order[:held_out])
    train = sorted(combos[i] for i in order[held_out:])
    return train, held


def shape_mask(shape: str, size: int, cx: float, cy: float, r: float) -> np.ndarray:
    """Boolean [size, size] mask of a shape of half-extent r centred at (cx, cy), pixel units."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float64) + 0.5
    dx, dy = np.abs(x - cx), np.abs(y - cy)
    if shape == "circle":
        return dx**2 + dy**2 <= r**2
    if shape == "square":
        return (dx <= r) & (dy <= r)
    if shape == "diamond":
        return dx + dy <= r
    if shape == "cross":
        arm = CROSS_ARM * r
        return ((dx <= r) & (dy <= arm)) | ((dy <= r) & (dx <= arm))
    if shape == "triangle":  # apex up: half-width grows linearly from the top to r at the base
        top = cy - r
        return (y >= top) & (y <= cy + r) & (dx <= (y - top) / 2.0)
    raise ValueError(f"unknown shape {shape!r}")


def render(
    spec: ShapeSpec, rng: np.random.Generator, size: int = 32, supersample: int = 4
) -> np.ndarray:
    """uint8 [size, size, 3]: the shape at a random size U(0.25, 0.38)·size and position."""
    r = rng.uniform(0.25, 0.38) * size
    cx = rng.uniform(r, size - r)
    cy = rng.uniform(r, size - r)
    big = size * supersample
    mask = shape_mask(spec.shape, big, cx * supersample, cy * supersample, r * supersample)
    img = np.empty((big, big, 3), dtype=np.float64)
    img[:] = PALETTE[spec.bg]
    img[mask] = PALETTE[spec.fg]
    img = img.reshape(size, supersample, size, supersample, 3).mean(axis=(1, 3))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def render_batch(specs: list[ShapeSpec], seed: int, size: int = 32) -> np.ndarray:
    """uint8 [N, size, size, 3], deterministic from the seed."""
    rng = np.random.default_rng(seed)
    return (
        np.stack([render(s, rng, size) for s in specs])
        if specs
        else np.zeros((0, size, size, 3), np.uint8)
    )
