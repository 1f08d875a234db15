"""DDPO's JPEG compressibility reward: −(JPEG size in kB at quality 95)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from .base import check_batch


class JpegCompressibility:
    name = "jpeg_compressibility"
    version = "1"

    def __init__(self, quality: int = 95) -> None:
        self.quality = quality

    def score(self, images, prompts: list[str]) -> np.ndarray:
        arr = check_batch(images, prompts)
        out = np.empty(arr.shape[0], dtype=np.float32)
        for i, img in enumerate(arr):
            buf = io.BytesIO()
            Image.fromarray(img).save(buf, format="JPEG", quality=self.quality)
            out[i] = -buf.tell() / 1000.0
        return out
