"""Labelled sample grids (PNG): one row per prompt, column groups side by side
(ground truth, base, each model or method), a title over each group."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

LABEL_WIDTH = 240
HEADER = 18
# PIL's default font has no Greek letters or superscripts (it draws a box): "G²RPO" and
# "Λ = {1,2}" are written in ASCII on the grids
_ASCII = str.maketrans({"²": "2", "Λ": "L", "λ": "l", "η": "eta", "Δ": "d", "−": "-", "×": "x"})


def _plain(text: str) -> str:
    return text.translate(_ASCII)


def labelled_grid(
    path: str | Path,
    labels: Sequence[str],
    groups: Sequence[tuple[str, np.ndarray]],
    *,
    scale: float = 3,
    max_tile: int = 256,
    title: str = "",
) -> Path:
    """``groups``: (title, uint8 images [len(labels), k, H, W, 3]) per column group.
    Tiles are drawn ``scale`` times their size, but never over ``max_tile`` pixels (a
    grid of 720² samples at 3× would be 17,000 pixels wide). Writes the grid to
    ``path`` and returns it."""
    from PIL import Image, ImageDraw

    if not groups:
        raise ValueError("a grid needs at least one column group")
    rows = len(labels)
    for name, imgs in groups:
        if imgs.ndim != 5 or imgs.shape[0] != rows:
            raise ValueError(f"group {name!r}: images {imgs.shape} do not match {rows} rows")
    h, w = groups[0][1].shape[2:4]
    scale = min(scale, max_tile / max(h, w))
    tile_w, tile_h = max(1, round(w * scale)), max(1, round(h * scale))
    resample = Image.NEAREST if scale >= 1 else Image.BILINEAR  # crisp up, smooth down
    cell_w, cell_h, gap = tile_w + 2, tile_h + 2, 10
    widths = [g[1].shape[1] * cell_w for g in groups]
    top = HEADER * (2 if title else 1)
    canvas = Image.new(
        "RGB", (LABEL_WIDTH + sum(widths) + gap * len(groups), top + rows * cell_h + 4), "white"
    )
    draw = ImageDraw.Draw(canvas)
    if title:
        draw.text((6, 3), _plain(title), fill="black")
    x0 = LABEL_WIDTH
    for (name, imgs), width in zip(groups, widths, strict=True):
        draw.text((x0, top - HEADER + 3), _plain(name), fill="black")
        for r in range(rows):
            for c in range(imgs.shape[1]):
                tile = Image.fromarray(imgs[r, c]).resize((tile_w, tile_h), resample)
                canvas.paste(tile, (x0 + c * cell_w, top + r * cell_h))
        x0 += width + gap
    for r, label in enumerate(labels):
        draw.text((6, top + r * cell_h + cell_h // 2 - 6), _plain(label), fill="black")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path)
    return path


def spread_rows(num_prompts: int, count: int) -> list[int]:
    """``count`` prompt indices spread over the list (varied shapes and colours)."""
    if num_prompts <= count:
        return list(range(num_prompts))
    return [int(i) for i in np.linspace(0, num_prompts - 1, count).round()]
