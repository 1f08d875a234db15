"""The luminance measures of ``common/health/image_health.py``, on images of any size: a 32² world
sample or a 1024² FLUX one, measured at their own resolution.

Each function takes luminance, float32 [N, H, W] in [0, 1] (``luminance``), and returns
float64 [N]. The spectral ones (``high_freq``, ``periodicity``) read the power spectra of
Hann-windowed tiles (``tiles``): the whole image up to ``TILE`` px a side, beyond that a grid
of ``TILE``² tiles covering it (evenly spaced, overlapping where the side is no multiple of
it), so a 1024² image costs sixteen 256² FFTs rather than one of 1024², and a hack confined
to a part of the image is one tile's whole story rather than a sixteenth of the image's.
"""

from __future__ import annotations

import functools

import numpy as np

TILE = 256  # px: a spectrum's tile side (frequency resolution 1/256 cycles per px)
MIN_RING = 3  # bins: nearer DC a tile's spectrum holds its composition, not texture
RADIAL_OFFSETS = (-4, -3, -2, 2, 3, 4)  # bins along the radius: a peak's local background
NOISE_FLOOR = 1.0  # grey levels: white noise of this std is the least background a bin has
GLYPH_CELL = 16  # px: glyph_area's cell at images of 256 px a side and more
GLYPH_CONTRAST = 0.08  # a glyph cell's luminance std, at least
GLYPH_SPLIT = 0.85  # a glyph cell's between-class share at mid-range, at least
GLYPH_CROSSINGS = 0.08  # a glyph cell's share of pixel steps crossing its split, each way


def luminance(images: np.ndarray) -> np.ndarray:
    """float32 [N, H, W] in [0, 1], Rec. 601 weights (channel slices: numpy reduces a last
    axis of 3 several times slower)."""
    x = np.asarray(images)
    r, g, b = (x[..., c].astype(np.float32) for c in range(3))
    return (r * 0.299 + g * 0.587 + b * 0.114) / 255.0


def _starts(side: int, tile: int) -> np.ndarray:
    """Tile origins along one side: ceil(side / tile) tiles from 0 to side − tile."""
    count = -(-side // tile)
    return np.rint(np.linspace(0, side - tile, count)).astype(int)


def tiles(y: np.ndarray, tile: int = TILE) -> np.ndarray:
    """float32 [N, K, th, tw]: the K tiles of each image (th = min(H, tile), the same for W)."""
    h, w = y.shape[1:]
    th, tw = min(h, tile), min(w, tile)
    parts = [y[:, i : i + th, j : j + tw] for i in _starts(h, th) for j in _starts(w, tw)]
    return np.stack(parts, axis=1)


@functools.lru_cache(maxsize=8)
def _hann(th: int, tw: int) -> np.ndarray:
    return (np.hanning(th)[:, None] * np.hanning(tw)[None, :]).astype(np.float32)


def spectra(y: np.ndarray, tile: int = TILE) -> np.ndarray:
    """float32 [N, K, th, tw//2+1]: each tile's half-plane power spectrum (real input: the
    other half mirrors it), of its luminance less its mean, Hann-windowed (the FFT's
    wrap-around, the jump from one border to the other, would otherwise count as an edge
    of every frequency). float32 rounding residue (far below one grey level) is set to 0,
    so that a flat tile has no spectrum at all."""
    t = tiles(y, tile)
    c = t - t.mean(axis=(2, 3), keepdims=True)
    c[np.abs(c) < 1e-4] = 0.0
    f = np.fft.rfft2(c * _hann(*t.shape[2:]))
    return (f.real**2 + f.imag**2).astype(np.float32)


@functools.lru_cache(maxsize=8)
def _radius(th: int, tw: int) -> np.ndarray:
    """Radial frequency of each bin of a real FFT (``rfft2``), in cycles per pixel."""
    fy, fx = np.fft.fftfreq(th)[:, None], np.fft.rfftfreq(tw)[None, :]
    return np.sqrt(fy**2 + fx**2)


@functools.lru_cache(maxsize=8)
def _mirror_weight(tw: int) -> np.ndarray:
    """The half-plane's columns 0 < fx < 0.5 each stand for two bins of the full spectrum
    (fx and −fx); fx = 0, and fx = 0.5 for an even width, for one."""
    weight = np.full(tw // 2 + 1, 2.0, np.float32)
    weight[0] = 1.0
    if tw % 2 == 0:
        weight[-1] = 1.0
    return weight


def high_freq(power: np.ndarray, width: int, cutoff: float, inclusive: bool) -> np.ndarray:
    """[N] share of the power above ``cutoff`` cycles per pixel (radially), of the tiles'
    spectra summed (Welch's averaged periodogram: a tiled image's share is its tiles'
    shares weighted by their power, as one spectrum of the whole image would weigh them);
    0 for a flat image. ``width``: the tiles' width; ``inclusive`` counts the bins at the
    cutoff as above it."""
    radius = _radius(power.shape[2], width)
    above = radius >= cutoff - 1e-12 if inclusive else radius > cutoff
    weighted = power * _mirror_weight(width)
    total = weighted.sum(axis=(1, 2, 3), dtype=np.float64)
    high = weighted[:, :, above].sum(axis=(1, 2), dtype=np.float64)
    return np.divide(high, total, out=np.zeros_like(total), where=total > 0)


@functools.lru_cache(maxsize=8)
def _radial_neighbours(th: int, tw: int, min_ring: int) -> tuple[np.ndarray, np.ndarray]:
    """(bins, neighbours): the flat indices into a [th, tw//2+1] spectrum of the bins from
    ``min_ring`` out, and [len(RADIAL_OFFSETS), bins] those of each one's neighbours along
    the line through DC, ``RADIAL_OFFSETS`` bins nearer and farther (at least one bin from
    DC, clipped to the spectrum's edge)."""
    half = tw // 2 + 1
    ky = np.fft.fftfreq(th, 1.0 / th)[:, None] * np.ones((1, half))
    kx = np.arange(half)[None, :] * np.ones((th, 1))
    ring = _radius(th, tw) * min(th, tw)
    keep = (ring >= min_ring).ravel()
    ky, kx = ky.ravel()[keep], kx.ravel()[keep]
    r = np.hypot(ky, kx)
    bins = np.flatnonzero(keep)
    near = []
    for offset in RADIAL_OFFSETS:
        s = np.maximum(r + offset, 1.0) / r
        ny = np.clip(np.rint(ky * s), -(th // 2), (th - 1) // 2).astype(int) % th
        nx = np.clip(np.rint(kx * s), 0, half - 1).astype(int)
        near.append(ny * half + nx)
    return bins, np.stack(near)


def periodicity(power: np.ndarray, width: int, min_ring: int = MIN_RING) -> np.ndarray:
    """[N] log10 of the largest prominence, over tiles and over bins from ``min_ring`` bins
    out (the axes included), of a bin's power over its local background: the largest
    power of its neighbours along the line through DC, 2 to 4 bins nearer and farther
    (``RADIAL_OFFSETS``: past the Hann window's ±1-bin spread of a sharp peak), plus the
    power white noise of ``NOISE_FLOOR`` grey levels puts in a bin (so the uint8 steps of
    a smooth gradient are no peak). An object's edge puts a continuous ridge of power on
    the line through DC perpendicular to it (an axis, for an upright object), its own
    background there; a periodic texture puts isolated, sharp peaks on it; natural
    texture's broad blobs are no higher than their neighbours 2 bins away. The max over
    tiles: the strongest peak of any tile, as one spectrum's max over its bins (a grid
    confined to one tile reads as it would over the whole image; a mean or quantile over
    tiles would dilute it). 0 for a flat image."""
    n, k, th, half = power.shape
    bins, near = _radial_neighbours(th, width, min_ring)
    if not len(bins):
        return np.zeros(n)
    flat = power.reshape(n * k, th * half)
    floor = (NOISE_FLOOR / 255.0) ** 2 * float((_hann(th, width) ** 2).sum())
    background = flat[:, near[0]]
    for idx in near[1:]:
        np.maximum(background, flat[:, idx], out=background)
    ratio = (flat[:, bins] / (background + np.float32(floor))).max(axis=1)
    return np.log10(np.maximum(ratio.reshape(n, k).max(axis=1).astype(np.float64), 1.0))


def contrast(y: np.ndarray) -> np.ndarray:
    """[N] RMS contrast: the standard deviation of the luminance in [0, 1]."""
    return y.std(axis=(1, 2), dtype=np.float64)


def sharpness(y: np.ndarray) -> np.ndarray:
    """[N] log10(var(∇²y) + 1e-8): the variance of the 4-neighbour Laplacian
    y[i−1,j] + y[i+1,j] + y[i,j−1] + y[i,j+1] − 4·y[i,j] over the interior pixels (a log:
    a change is a ratio; an unsharp mask raises it; a flat image reads −8)."""
    c = y[:, 1:-1, 1:-1]
    lap = y[:, :-2, 1:-1] + y[:, 2:, 1:-1] + y[:, 1:-1, :-2] + y[:, 1:-1, 2:] - 4.0 * c
    return np.log10(lap.var(axis=(1, 2), dtype=np.float64) + 1e-8)


def glyph_cell(h: int, w: int) -> int:
    """glyph_area's cell side: ``GLYPH_CELL`` px at 256 px a side and more, a sixteenth of
    the shorter side below, 8 px at least (at 32², 4 px cells would read the corners of
    shapes as strokes)."""
    return int(min(GLYPH_CELL, max(8, min(h, w) // 16)))


def glyph_cells(y: np.ndarray, cell: int) -> np.ndarray:
    """bool [N, H // cell, W // cell]: the text-like cells (the image's remainder past the
    last whole cell is left out). Each cell is split at the middle of its luminance range,
    t = (min + max) / 2 (text is ink of one level on a ground of another); it is text-like
    when it has contrast (luminance std σ ≥ ``GLYPH_CONTRAST``), two levels (Otsu's
    between-class share of its variance at t, p·(1−p)·(μ₁−μ₀)² / σ², ≥ ``GLYPH_SPLIT``:
    1 for two levels, 2/π for a Gaussian's spread), and strokes both ways (the share of
    pixel steps that cross t, along rows and along columns, each ≥ ``GLYPH_CROSSINGS``: an
    edge between two regions crosses once a row, glyphs several times both ways)."""
    n, h, w = y.shape
    gy, gx = h // cell, w // cell
    c = y[:, : gy * cell, : gx * cell].reshape(n, gy, cell, gx, cell)
    std = c.std(axis=(2, 4))
    mid = (c.max(axis=(2, 4), keepdims=True) + c.min(axis=(2, 4), keepdims=True)) * 0.5
    above = c > mid
    count = above.sum(axis=(2, 4))
    hi = np.where(above, c, 0).sum(axis=(2, 4)) / np.maximum(count, 1)
    lo = np.where(above, 0, c).sum(axis=(2, 4)) / np.maximum(cell * cell - count, 1)
    p, var = count / (cell * cell), std**2
    split = np.divide(p * (1 - p) * (hi - lo) ** 2, var, out=np.zeros_like(var), where=var > 0)
    rows = (above[:, :, :, :, 1:] != above[:, :, :, :, :-1]).mean(axis=(2, 4))
    cols = (above[:, :, 1:] != above[:, :, :-1]).mean(axis=(2, 4))
    return (
        (std >= GLYPH_CONTRAST)
        & (split >= GLYPH_SPLIT)
        & (rows >= GLYPH_CROSSINGS)
        & (cols >= GLYPH_CROSSINGS)
    )


def glyph_area(y: np.ndarray) -> np.ndarray:
    """[N] the share of the image's cells that are text-like (``glyph_cells``)."""
    return glyph_cells(y, glyph_cell(*y.shape[1:])).mean(axis=(1, 2), dtype=np.float64)
