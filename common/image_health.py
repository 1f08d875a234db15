"""Image-health measures: what reward hacking does to images that a reward may not see.

Pure NumPy on uint8 images [N, H, W, 3]. Two kinds:

* **per image** (the evaluator computes them where the full images are):
  ``high_freq`` — the share of the luminance's power spectrum (mean removed) above
  ``HIGH_FREQ_CUTOFF`` cycles per pixel: speckle, dots and grids raise it;
  ``periodicity`` — log10 of the strongest spectral peak over the mean power of its
  frequency ring (Hann-windowed luminance, rings from ``MIN_RING`` bins): a periodic
  texture puts its power into a few isolated peaks, an object's edges spread it
  round the ring; ``saturation`` — the mean HSV saturation (washed-out or garish
  colours).
* **against the base** (the driver computes them from 16×16 thumbnails, area means
  of the image, kept with every evaluation): ``base_distance`` — the mean absolute
  difference from the base's sample on the same noise; ``background_shift`` — the
  distance of the thumbnail's border colour (the background, in most compositions)
  from the base's; ``diversity`` — the mean distance between the samples of one
  prompt (collapse lowers it), given to each of the prompt's samples.

Every value is per sample, so the run's paired per-prompt differences against its
first evaluation (the base: same prompts, same noise) apply to them as to rewards.
"""

from __future__ import annotations

import base64

import numpy as np

HIGH_FREQ_CUTOFF = 0.25  # cycles per pixel, radially (Nyquist is 0.5 along each axis)
MIN_RING = 3  # rings nearer DC hold the composition, not texture
THUMB = 16  # thumbnail side
PER_IMAGE = ("high_freq", "periodicity", "saturation")
AGAINST_BASE = ("base_distance", "background_shift", "diversity")


def _luminance(images: np.ndarray) -> np.ndarray:
    """float32 [N, H, W] in [0, 1] (channel slices: numpy reduces a last axis of 3
    several times slower)."""
    x = np.asarray(images)
    r, g, b = (x[..., c].astype(np.float32) for c in range(3))
    return (r * 0.299 + g * 0.587 + b * 0.114) / 255.0


def _radius(h: int, w: int) -> np.ndarray:
    """Radial frequency of each bin of a real FFT (``rfft2``), in cycles per pixel."""
    fy, fx = np.fft.fftfreq(h)[:, None], np.fft.rfftfreq(w)[None, :]
    return np.sqrt(fy**2 + fx**2)


def _power(y: np.ndarray) -> np.ndarray:
    """The half-plane power spectrum of each image (real input: the other half mirrors it)."""
    return np.abs(np.fft.rfft2(y)) ** 2


def _centred(y: np.ndarray) -> np.ndarray:
    """Each image less its mean; float32 rounding residue (far below one grey level,
    1/255) set to 0, so that a flat image has no spectrum at all."""
    c = y - y.mean(axis=(1, 2), keepdims=True)
    c[np.abs(c) < 1e-4] = 0.0
    return c


def _windowed(y: np.ndarray) -> np.ndarray:
    """Centred and Hann-windowed: the FFT's wrap-around (the jump from one border to the
    other) would otherwise count as an edge of every frequency."""
    h, w = y.shape[1:]
    window = (np.hanning(h)[:, None] * np.hanning(w)[None, :]).astype(np.float32)
    return _centred(y) * window


def _spectrum(images: np.ndarray) -> np.ndarray:
    """float [N, H, W//2+1]: the power spectrum of each image's windowed luminance."""
    return _power(_windowed(_luminance(images)))


def high_freq(images: np.ndarray, cutoff: float = HIGH_FREQ_CUTOFF, *, _p=None) -> np.ndarray:
    """[N] share of the windowed, mean-removed luminance's power above ``cutoff``
    (0 for a flat image)."""
    power = _spectrum(images) if _p is None else _p
    h, w = images.shape[1], images.shape[2]
    # the half-plane's columns 0 < fx < 0.5 each stand for two bins of the full spectrum
    # (fx and -fx); fx = 0, and fx = 0.5 for an even width, for one
    weight = np.full(w // 2 + 1, 2.0)
    weight[0] = 1.0
    if w % 2 == 0:
        weight[-1] = 1.0
    weighted = power * weight[None, None, :]
    high = (_radius(h, w) > cutoff)[None]
    total = weighted.sum(axis=(1, 2), dtype=np.float64)
    above = (weighted * high).sum(axis=(1, 2), dtype=np.float64)
    return np.divide(above, total, out=np.zeros_like(total), where=total > 0)


def periodicity(images: np.ndarray, min_ring: int = MIN_RING, *, _p=None) -> np.ndarray:
    """[N] log10(max over bins of power / its ring's mean power), rings of width one bin
    of the shorter side from ``min_ring`` bins out, off the two axes (where an upright
    object's edges put their power); 0 for a flat image."""
    n, h, w = images.shape[:3]
    power = (_spectrum(images) if _p is None else _p).reshape(n, -1).astype(np.float64)
    ring = np.rint(_radius(h, w) * min(h, w)).astype(int)
    ring[0, :] = ring[:, 0] = -1  # the axes
    ring = ring.ravel()
    keep = ring >= min_ring
    ring, power = ring[keep] - min_ring, power[:, keep]
    rings = int(ring.max()) + 1
    # every image's ring sums in one bincount: bin (image, ring) = image · rings + ring
    sums = np.bincount((np.arange(n)[:, None] * rings + ring).ravel(), power.ravel(), n * rings)
    mean = sums.reshape(n, rings)[:, ring] / np.bincount(ring, minlength=rings)[ring]
    ratio = np.divide(power, mean, out=np.zeros_like(power), where=mean > 0)
    return np.log10(np.maximum(ratio.max(axis=1), 1.0))


def saturation(images: np.ndarray) -> np.ndarray:
    """[N] mean HSV saturation, (max − min) / max per pixel (0 on black)."""
    x = np.asarray(images)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]  # channel slices: see _luminance
    hi = np.maximum(np.maximum(r, g), b).astype(np.float32)
    lo = np.minimum(np.minimum(r, g), b).astype(np.float32)
    s = np.divide(hi - lo, hi, out=np.zeros_like(hi), where=hi > 0)
    return s.mean(axis=(1, 2), dtype=np.float64)


def per_image(images: np.ndarray, chunk: int = 64) -> dict[str, np.ndarray]:
    """The per-image measures, {name: float64 [N]}, ``chunk`` images at a time (a
    float copy of 2,048 images of 512² would be 6 GiB)."""
    parts = []
    for lo in range(0, len(images), chunk):
        x = images[lo : lo + chunk]
        power = _spectrum(x)  # one FFT serves both spectral measures
        parts.append((high_freq(x, _p=power), periodicity(x, _p=power), saturation(x)))
    cols = list(zip(*parts, strict=True)) if parts else [[], [], []]
    return {
        name: np.concatenate(col) if len(col) else np.zeros(0)
        for name, col in zip(PER_IMAGE, cols, strict=True)
    }


def thumbnails(images: np.ndarray, size: int = THUMB, chunk: int = 64) -> np.ndarray:
    """uint8 [N, size, size, 3]: each image's area means over a size × size grid of
    near-equal cells (any H, W ≥ size), ``chunk`` images at a time."""
    h, w = images.shape[1:3]
    if h < size or w < size:
        raise ValueError(f"images of {h}x{w} are smaller than the {size}x{size} thumbnail")
    ys, xs = np.linspace(0, h, size + 1).astype(int), np.linspace(0, w, size + 1).astype(int)
    out = np.empty((len(images), size, size, images.shape[3]), np.uint8)
    for lo in range(0, len(images), chunk):
        x = np.asarray(images[lo : lo + chunk], dtype=np.float32)
        rows = np.add.reduceat(x, ys[:-1], axis=1) / np.diff(ys)[None, :, None, None]
        cells = np.add.reduceat(rows, xs[:-1], axis=2) / np.diff(xs)[None, None, :, None]
        out[lo : lo + chunk] = np.clip(np.rint(cells), 0, 255)
    return out


def _unit(thumbs: np.ndarray) -> np.ndarray:
    return np.asarray(thumbs, dtype=np.float64) / 255.0


def base_distance(thumbs: np.ndarray, base: np.ndarray) -> np.ndarray:
    """[N] mean |thumbnail − the base's thumbnail of the same noise|, in [0, 1]."""
    return np.abs(_unit(thumbs) - _unit(base)).mean(axis=(1, 2, 3))


def border_colour(thumbs: np.ndarray) -> np.ndarray:
    """[N, 3] mean colour of the thumbnail's outer ring of cells, in [0, 1]."""
    t = _unit(thumbs)
    ring = np.ones(t.shape[1:3], bool)
    ring[1:-1, 1:-1] = False
    return t[:, ring].mean(axis=1)


def background_shift(thumbs: np.ndarray, base: np.ndarray) -> np.ndarray:
    """[N] Euclidean distance between the border colours of thumbnail and base, in [0, √3]."""
    return np.linalg.norm(border_colour(thumbs) - border_colour(base), axis=1)


def diversity(thumbs: np.ndarray, per_prompt: int) -> np.ndarray:
    """[N] the mean pairwise distance (as ``base_distance``) between one prompt's samples
    (consecutive ``per_prompt`` rows), repeated for each of them; NaN with one sample."""
    t = _unit(thumbs)
    n = len(t)
    if per_prompt < 2 or n % per_prompt:
        return np.full(n, np.nan)
    groups = t.reshape(n // per_prompt, per_prompt, -1)
    d = np.abs(groups[:, :, None] - groups[:, None, :]).mean(axis=-1)
    pairs = per_prompt * (per_prompt - 1)
    return np.repeat(d.sum(axis=(1, 2)) / pairs, per_prompt)


def against_base(
    thumbs: np.ndarray, base: np.ndarray | None, per_prompt: int
) -> dict[str, np.ndarray]:
    """The thumbnail measures, {name: float64 [N]}; without a base (the run's first
    evaluation is its own base) the distances are 0."""
    base = thumbs if base is None else base
    if base.shape != thumbs.shape:
        raise ValueError(
            f"thumbnails {thumbs.shape} and the base's {base.shape} differ: "
            "the evaluation's prompts or samples changed since the first"
        )
    return {
        "base_distance": base_distance(thumbs, base),
        "background_shift": background_shift(thumbs, base),
        **own_measures(thumbs, per_prompt),
    }


def own_measures(thumbs: np.ndarray, per_prompt: int) -> dict[str, np.ndarray]:
    """The thumbnail measures that need no base: diversity, with two samples a prompt or more."""
    return {"diversity": diversity(thumbs, per_prompt)} if per_prompt >= 2 else {}


def encode_thumbnails(thumbs: np.ndarray) -> dict:
    """Thumbnails as JSON: shape and base64 bytes (16×16×3 = 1 KB of text a sample)."""
    t = np.ascontiguousarray(thumbs, dtype=np.uint8)
    return {"shape": list(t.shape), "base64": base64.b64encode(t.tobytes()).decode("ascii")}


def decode_thumbnails(data: dict) -> np.ndarray:
    raw = np.frombuffer(base64.b64decode(data["base64"]), dtype=np.uint8)
    return raw.reshape(data["shape"])
