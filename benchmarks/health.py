"""``g2rpo bench health``: what the image-health measures cost an evaluation on the CPU,
per image and per evaluation, at the image sizes of the shipped recipes: the per-image
measures (two FFTs of the luminance, saturation) on the evaluator, the thumbnail, and the
driver's measures against the base (distance, background, diversity) from thumbnails.
Images are random uint8 (the cost does not depend on what they show)."""

from __future__ import annotations

import time

import numpy as np

from ..common import image_health


def bench_health(sizes: list[int], images: int = 32, per_prompt: int = 4, repeats: int = 3):
    """{size: seconds per image of each stage (the fastest of ``repeats``, process time:
    the CPU it costs, whatever else the machine runs)}."""
    rng = np.random.default_rng(0)
    out = {}
    for size in sizes:
        batch = rng.integers(0, 256, (images, size, size, 3), dtype=np.uint8)
        thumbs = image_health.thumbnails(batch)
        stages = {
            "per_image": lambda b=batch: image_health.per_image(b),
            "thumbnails": lambda b=batch: image_health.thumbnails(b),
            "against_base": lambda t=thumbs: image_health.against_base(t, t[::-1], per_prompt),
        }
        out[size] = {}
        for name, fn in stages.items():
            best = float("inf")
            for _ in range(repeats):
                start = time.process_time()
                fn()
                best = min(best, time.process_time() - start)
            out[size][name] = best / images
    return out
