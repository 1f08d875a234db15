"""Image batches on the wire: raw uint8 in safetensors, or PNG files."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from .scorers.base import BadInput


class TooLarge(ValueError):
    """A payload or image over the server's limits (HTTP 413)."""


def encode_safetensors(images: np.ndarray) -> bytes:
    from safetensors.numpy import save

    arr = np.ascontiguousarray(images)
    if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[-1] != 3:
        raise ValueError(f"images must be uint8 [N, H, W, 3], got {arr.dtype} {list(arr.shape)}")
    return save({"images": arr})


def decode_safetensors(data: bytes) -> np.ndarray:
    from safetensors.numpy import load

    try:
        tensors = load(data)
    except Exception as exc:  # malformed header or truncated buffer
        raise BadInput(f"images: not a valid safetensors buffer ({exc})") from None
    if set(tensors) != {"images"}:
        raise BadInput(
            f"images: the safetensors file must hold one tensor 'images', got {sorted(tensors)}"
        )
    arr = tensors["images"]
    if arr.dtype != np.uint8:
        raise BadInput(f"images: dtype must be uint8, got {arr.dtype}")
    if arr.ndim != 4 or arr.shape[-1] != 3:
        raise BadInput(f"images: shape must be [N, H, W, 3], got {list(arr.shape)}")
    return arr


def encode_png(image: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


def decode_pngs(files: list[bytes], max_side: int) -> np.ndarray:
    arrays = []
    for i, data in enumerate(files):
        try:
            with Image.open(io.BytesIO(data)) as img:
                if img.format != "PNG":
                    raise BadInput(f"images[{i}]: expected PNG, got {img.format}")
                if max(img.size) > max_side:
                    raise TooLarge(
                        f"images[{i}]: {img.size[0]}x{img.size[1]} exceeds {max_side} px"
                    )
                arrays.append(np.asarray(img.convert("RGB")))
        except (BadInput, TooLarge):
            raise
        except Exception as exc:
            raise BadInput(f"images[{i}]: not a readable PNG ({exc})") from None
    if not arrays:
        raise BadInput("images: no images sent")
    if len({a.shape for a in arrays}) != 1:
        raise BadInput("images: all PNGs of one request must have the same size")
    return np.stack(arrays)
