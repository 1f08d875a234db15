"""``g2rpo bench health``: what the image-health measures cost an evaluation on the CPU,
per image and per evaluation, at the image sizes of the shipped recipes: the per-image
measures (the tiles' FFTs of the luminance, saturation, contrast, the Laplacian, the glyph
cells) on the evaluator, the thumbnail, and the driver's measures against the base
(distance, background, diversity) from thumbnails; and each per-image measure alone
(``bench_measures``: each computes its own luminance, and the spectral ones their own
spectra, which ``per_image`` shares). Images are random uint8 (the cost does not depend
on what they show). Run it with ``OMP_NUM_THREADS=1`` for one core's cost."""

from __future__ import annotations

import time

import numpy as np

from ..common.algorithms.flops import best_seconds
from ..common.health import image_health


def _best(fn, repeats: int) -> float:
    """The fastest of ``repeats`` calls, in process time (the CPU it costs)."""
    return best_seconds(fn, repeats, clock=time.process_time)


def _batch(size: int, images: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (images, size, size, 3), dtype=np.uint8)


def bench_health(sizes: list[int], images: int = 32, per_prompt: int = 4, repeats: int = 3):
    """{size: seconds per image of each stage}."""
    out = {}
    for size in sizes:
        batch = _batch(size, images)
        thumbs = image_health.thumbnails(batch)
        stages = {
            "per_image": lambda b=batch: image_health.per_image(b),
            "thumbnails": lambda b=batch: image_health.thumbnails(b),
            "against_base": lambda t=thumbs: image_health.against_base(t, t[::-1], per_prompt),
        }
        out[size] = {name: _best(fn, repeats) / images for name, fn in stages.items()}
    return out


def bench_measures(sizes: list[int], images: int = 32, repeats: int = 3):
    """{size: seconds per image of each per-image measure computed alone}."""
    H = image_health
    measures = {
        "high_freq": H.high_freq,
        **{name: lambda b, c=cut: H.high_freq_patch(b, c) for name, cut in H.PATCH_CUTOFFS.items()},
        "periodicity": H.periodicity,
        "saturation": H.saturation,
        "contrast": H.contrast,
        "sharpness": H.sharpness,
        "glyph_area": H.glyph_area,
    }
    assert tuple(measures) == H.PER_IMAGE, "bench_measures: a per-image measure is missing"
    out = {}
    for size in sizes:
        batch = _batch(size, images)
        out[size] = {
            name: _best(
                lambda f=fn, b=batch: [f(b[i : i + 8]) for i in range(0, images, 8)], repeats
            )
            / images
            for name, fn in measures.items()
        }
    return out
