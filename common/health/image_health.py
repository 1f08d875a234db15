"""Image-health measures: what reward hacking does to images that a reward may not see.

Pure NumPy on uint8 images [N, H, W, 3], at their own resolution (a 32² world sample or a
1024² FLUX one). Two kinds:

* **per image** (the evaluator computes them where the full images are; the luminance
  ones live in ``common/health/image_texture.py``, which defines each):
  ``high_freq`` — the share of the luminance's power (mean removed, Hann-windowed) above
  ``HIGH_FREQ_CUTOFF`` cycles per pixel: speckle, dots and grids raise it;
  ``high_freq_p8``, ``high_freq_p16`` — the same from 1/8 and 1/16 cycles per pixel on,
  where an 8- and a 16-px patch grid (FLUX: 2×2 latent patches × the VAE's 8×) put their
  fundamental and harmonics; ``periodicity`` — log10 of the most prominent sharp peak of
  the spectrum over its neighbours along the line through DC, the axes included (a
  periodic texture's isolated peaks; an object's edges make ridges, not peaks);
  ``saturation`` — the mean HSV saturation (washed-out or garish colours); ``contrast``
  — RMS contrast; ``sharpness`` — log10 of the Laplacian's variance (over-sharpening);
  ``glyph_area`` — the share of the image in text-like cells (watermarks, captions).
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

from . import image_texture as tex

HIGH_FREQ_CUTOFF = 0.25  # cycles per pixel, radially (Nyquist is 0.5 along each axis)
PATCH_CUTOFFS = {"high_freq_p8": 1 / 8, "high_freq_p16": 1 / 16}  # cycles per pixel
MIN_RING = tex.MIN_RING
THUMB = 16  # thumbnail side
PER_IMAGE = (
    "high_freq",
    "high_freq_p8",
    "high_freq_p16",
    "periodicity",
    "saturation",
    "contrast",
    "sharpness",
    "glyph_area",
)
AGAINST_BASE = ("base_distance", "background_shift", "diversity")
PIXELS_PER_CHUNK = 1 << 24  # a chunk's float32 luminance and spectra stay near 64 MiB each


def _spectra(images: np.ndarray) -> tuple[np.ndarray, int]:
    """(the tiles' power spectra, the tiles' width): see image_texture.spectra."""
    return tex.spectra(tex.luminance(images)), min(images.shape[2], tex.TILE)


def high_freq(images: np.ndarray, cutoff: float = HIGH_FREQ_CUTOFF, *, _p=None) -> np.ndarray:
    """[N] share of the windowed, mean-removed luminance's power above ``cutoff`` cycles
    per pixel, radially (strictly above: the values, and the alerts set on them, are
    those of before images were tiled, at 256² and below); 0 for a flat image."""
    power, width = _spectra(images) if _p is None else _p
    return tex.high_freq(power, width, cutoff, inclusive=False)


def high_freq_patch(images: np.ndarray, cutoff: float, *, _p=None) -> np.ndarray:
    """[N] the same share from ``cutoff`` on, the bins at the cutoff included: a patch
    grid of period 1/cutoff px puts its fundamental there (and the Hann window 1/6 of a
    sharp peak's power in each bin beside it: strictly above, a 16-px grid's
    fundamental would count 1/6, inclusive 5/6)."""
    power, width = _spectra(images) if _p is None else _p
    return tex.high_freq(power, width, cutoff, inclusive=True)


def periodicity(images: np.ndarray, min_ring: int = MIN_RING, *, _p=None) -> np.ndarray:
    """[N] log10 of the most prominent sharp spectral peak: image_texture.periodicity."""
    power, width = _spectra(images) if _p is None else _p
    return tex.periodicity(power, width, min_ring)


def saturation(images: np.ndarray) -> np.ndarray:
    """[N] mean HSV saturation, (max − min) / max per pixel (0 on black)."""
    x = np.asarray(images)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]  # channel slices: see image_texture.luminance
    hi = np.maximum(np.maximum(r, g), b).astype(np.float32)
    lo = np.minimum(np.minimum(r, g), b).astype(np.float32)
    s = np.divide(hi - lo, hi, out=np.zeros_like(hi), where=hi > 0)
    return s.mean(axis=(1, 2), dtype=np.float64)


def contrast(images: np.ndarray) -> np.ndarray:
    """[N] RMS contrast, the luminance's std in [0, 1]: image_texture.contrast."""
    return tex.contrast(tex.luminance(images))


def sharpness(images: np.ndarray) -> np.ndarray:
    """[N] log10 of the Laplacian's variance: image_texture.sharpness."""
    return tex.sharpness(tex.luminance(images))


def glyph_area(images: np.ndarray) -> np.ndarray:
    """[N] the share of the image in text-like cells: image_texture.glyph_area."""
    return tex.glyph_area(tex.luminance(images))


def _measures(x: np.ndarray) -> dict[str, np.ndarray]:
    """PER_IMAGE of one chunk: one luminance and one set of tile spectra serve them all."""
    y = tex.luminance(x)
    spec = tex.spectra(y), min(x.shape[2], tex.TILE)
    return {
        "high_freq": high_freq(x, _p=spec),
        **{name: high_freq_patch(x, cut, _p=spec) for name, cut in PATCH_CUTOFFS.items()},
        "periodicity": periodicity(x, _p=spec),
        "saturation": saturation(x),
        "contrast": tex.contrast(y),
        "sharpness": tex.sharpness(y),
        "glyph_area": tex.glyph_area(y),
    }


def per_image(images: np.ndarray, chunk: int = 64) -> dict[str, np.ndarray]:
    """The per-image measures, {name: float64 [N]} in PER_IMAGE's order, ``chunk`` images
    at a time and fewer for large ones (``PIXELS_PER_CHUNK``: a float copy of 2,048
    images of 1024² would be 8 GiB)."""
    n, h, w = len(images), *np.shape(images)[1:3]
    step = max(1, min(chunk, PIXELS_PER_CHUNK // max(h * w, 1)))
    parts = [_measures(images[lo : lo + step]) for lo in range(0, n, step)]
    return {
        name: np.concatenate([p[name] for p in parts]) if parts else np.zeros(0)
        for name in PER_IMAGE
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
