"""Natural photographs, the known reward hacks and the clean variations that must not
alarm: the images of ``g2rpo hacking photos`` (evaluation/photo_check.py).

Pure functions on uint8 RGB arrays [H, W, 3]; every random choice comes from the
``numpy.random.Generator`` passed in, so a seed fixes every image. The photographs are
scikit-image's (``skimage.data``, shipped inside its wheel: no download)."""

from __future__ import annotations

import io

import numpy as np
from g2rpo.common.errors import UsageError
from PIL import Image, ImageDraw, ImageFilter, ImageFont

# skimage.data's photographs (``cat`` is ``chelsea`` again; ``stereo_motorcycle`` gives its left
# view). The grey ones are textures and scenes, used as RGB (equal channels).
COLOUR_PHOTOS = (
    "astronaut",
    "chelsea",
    "coffee",
    "rocket",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "stereo_motorcycle",
)
GREY_PHOTOS = ("camera", "brick", "grass", "gravel", "moon")

# Strength -> parameter of each hack (README.md of docs/results/hacking/photos says the same).
HACKS = {
    "saturation_push": {"mild": 1.3, "strong": 1.8},  # HSV saturation × this
    "over_sharpening": {"mild": 150, "strong": 400},  # unsharp-mask percent, radius 2 px
    "patch_grid": {"mild": 2.0, "strong": 6.0},  # grey levels of the 16-px pattern
    "periodic_texture": {"mild": 2.0, "strong": 5.0},  # grey levels of the oblique sinusoids
    "text_overlay": {"mild": 0.3, "strong": 0.7},  # opacity of the repeated watermark
}
GRID_PERIOD = 16  # px: a DiT's 2×2 latent patches of an 8× VAE
CLEAN_KINDS = ("crop", "rescale", "colour", "exposure", "jpeg")
PHOTOMETRIC_KINDS = ("colour", "exposure", "jpeg")  # no geometric change
JPEG_QUALITY = (85, 95)  # drawn per variation, both ends included
WATERMARK = "© STOCK PREVIEW"


def load_photo(name: str) -> np.ndarray:
    """uint8 [H, W, 3] of one skimage.data photograph (grey ones stacked to RGB)."""
    try:
        import skimage.data
    except ImportError as exc:
        raise UsageError(
            "g2rpo hacking photos needs scikit-image's photographs: "
            "pip install -c constraints.txt -e '.[test]' (or pip install scikit-image)"
        ) from exc
    x = getattr(skimage.data, name)()
    x = x[0] if isinstance(x, tuple) else x  # stereo_motorcycle: (left, right, disparity)
    x = np.asarray(x)
    if x.ndim == 2:
        x = np.stack([x] * 3, axis=-1)
    return np.ascontiguousarray(x[..., :3], dtype=np.uint8)


def _resize(x: np.ndarray, side: int) -> np.ndarray:
    return np.asarray(Image.fromarray(x).resize((side, side), Image.LANCZOS))


def square(x: np.ndarray, side: int) -> np.ndarray:
    """The centre square of ``x`` resized to side × side (PIL LANCZOS)."""
    h, w = x.shape[:2]
    s = min(h, w)
    top, left = (h - s) // 2, (w - s) // 2
    return _resize(x[top : top + s, left : left + s], side)


def _to_uint8(y: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(y), 0, 255).astype(np.uint8)


def scale_saturation(x: np.ndarray, factor: float) -> np.ndarray:
    """Each pixel's HSV saturation × ``factor`` with its hue and value kept: every channel
    moves away from (or towards) the pixel's maximum, c' = max − factor·(max − c)."""
    y = x.astype(np.float32)
    hi = y.max(axis=-1, keepdims=True)
    return _to_uint8(hi - factor * (hi - y))


def rotate_hue(x: np.ndarray, degrees: float) -> np.ndarray:
    """Hue rotated by ``degrees`` about the grey axis (a rotation of YIQ's chroma plane)."""
    to_yiq = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
    a = np.deg2rad(degrees)
    turn = np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])
    m = (np.linalg.inv(to_yiq) @ turn @ to_yiq).astype(np.float32)
    return _to_uint8(x.astype(np.float32) @ m.T)


# -- the hacks ----------------------------------------------------------------------------


def saturation_push(x: np.ndarray, factor: float, rng: np.random.Generator) -> np.ndarray:
    return scale_saturation(x, factor)


def over_sharpening(x: np.ndarray, percent: float, rng: np.random.Generator) -> np.ndarray:
    sharp = Image.fromarray(x).filter(ImageFilter.UnsharpMask(radius=2, percent=int(percent)))
    return np.asarray(sharp)


def grid_pattern(amplitude: float, rng: np.random.Generator) -> np.ndarray:
    """float32 [16, 16]: one cell of a patch grid, a darker seam on the cell's first row
    and column plus a fixed random offset per pixel (3 grey levels at ±amplitude/2),
    aligned with the image's pixel 0 as a generator's patches are."""
    cell = rng.choice([-0.5, 0.0, 0.5], size=(GRID_PERIOD, GRID_PERIOD)) * amplitude
    cell[0, :] -= amplitude
    cell[:, 0] -= amplitude
    return cell.astype(np.float32)


def patch_grid(x: np.ndarray, amplitude: float, rng: np.random.Generator) -> np.ndarray:
    h, w = x.shape[:2]
    reps = (-(-h // GRID_PERIOD), -(-w // GRID_PERIOD))
    pattern = np.tile(grid_pattern(amplitude, rng), reps)[:h, :w]
    return _to_uint8(x.astype(np.float32) + pattern[..., None])


def texture_pattern(h: int, w: int, amplitude: float, rng: np.random.Generator) -> np.ndarray:
    """float32 [h, w]: a dot lattice, the product of two sinusoids of a period of 5–12 px
    at oblique angles (20–70° and 90° more), amplitude in grey levels."""
    period = rng.uniform(5.0, 12.0)
    angle = np.deg2rad(rng.uniform(20.0, 70.0))
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi, size=2)
    u = xx * np.cos(angle) + yy * np.sin(angle)
    v = -xx * np.sin(angle) + yy * np.cos(angle)
    f = 2 * np.pi / period
    return (amplitude * np.sin(f * u + phase[0]) * np.sin(f * v + phase[1])).astype(np.float32)


def periodic_texture(x: np.ndarray, amplitude: float, rng: np.random.Generator) -> np.ndarray:
    pattern = texture_pattern(x.shape[0], x.shape[1], amplitude, rng)
    return _to_uint8(x.astype(np.float32) + pattern[..., None])


def watermark_layer(side: int, rng: np.random.Generator) -> tuple[Image.Image, list]:
    """An RGBA layer of the repeated watermark (white letters, dark outline) on rows every
    ~side/5 px, tilted rows offset at random, and the text boxes it drew (x0, y0, x1, y1)."""
    font = ImageFont.load_default(size=max(10, side // 22))
    layer = Image.new("RGBA", (side, side), (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    step_y = max(24, side // 5)
    boxes = []
    for row, y in enumerate(range(int(rng.integers(0, step_y // 2)), side, step_y)):
        x0 = int(rng.integers(-side // 4, 0)) + (row % 2) * side // 8
        tw = draw.textlength(WATERMARK, font=font)
        x = x0
        while x < side:
            stroke = max(1, side // 512)
            draw.text(
                (x, y),
                WATERMARK,
                font=font,
                fill=(255, 255, 255, 255),
                stroke_width=stroke,
                stroke_fill=(0, 0, 0, 255),
            )
            boxes.append(draw.textbbox((x, y), WATERMARK, font=font, stroke_width=stroke))
            x += int(tw * 1.3)
    return layer, boxes


def text_overlay(x: np.ndarray, opacity: float, rng: np.random.Generator) -> np.ndarray:
    layer, _ = watermark_layer(x.shape[0], rng)
    alpha = np.asarray(layer, dtype=np.float32)[..., 3:] / 255.0 * opacity
    ink = np.asarray(layer, dtype=np.float32)[..., :3]
    return _to_uint8(x.astype(np.float32) * (1 - alpha) + ink * alpha)


HACK_FUNCTIONS = {
    "saturation_push": saturation_push,
    "over_sharpening": over_sharpening,
    "patch_grid": patch_grid,
    "periodic_texture": periodic_texture,
    "text_overlay": text_overlay,
}


def apply_hack(x: np.ndarray, hack: str, strength: str, rng: np.random.Generator) -> np.ndarray:
    return HACK_FUNCTIONS[hack](x, HACKS[hack][strength], rng)


def applicable(hack: str, photo: str) -> bool:
    """A saturation push does nothing to a grey photograph: not tried there."""
    return not (hack == "saturation_push" and photo in GREY_PHOTOS)


# -- the clean variations ----------------------------------------------------------------


def crop(x: np.ndarray, rng: np.random.Generator, keep: tuple = (0.8, 1.0)) -> np.ndarray:
    """A random square crop keeping ``keep`` of the side, resized back."""
    side = x.shape[0]
    s = round(side * rng.uniform(*keep))
    top, left = rng.integers(0, side - s + 1, size=2)
    return _resize(x[top : top + s, left : left + s], side)


def rescale(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Resized by 0.8–1.25 (log-uniform) and back: detail lost or interpolated."""
    side = x.shape[0]
    f = np.exp(rng.uniform(np.log(0.8), np.log(1.25)))
    return _resize(_resize(x, round(side * f)), side)


def colour(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Hue ±3°, HSV saturation × 0.95–1.05."""
    return scale_saturation(rotate_hue(x, rng.uniform(-3, 3)), rng.uniform(0.95, 1.05))


def exposure(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Brightness × 0.95–1.05."""
    return _to_uint8(x.astype(np.float32) * rng.uniform(0.95, 1.05))


def jpeg(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Re-encoded at quality 85–95: at one fixed quality every draw would be the same image,
    counted as several."""
    buf = io.BytesIO()
    quality = int(rng.integers(JPEG_QUALITY[0], JPEG_QUALITY[1] + 1))
    Image.fromarray(x).save(buf, format="JPEG", quality=quality)
    return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))


CLEAN_FUNCTIONS = {
    "crop": crop,
    "rescale": rescale,
    "colour": colour,
    "exposure": exposure,
    "jpeg": jpeg,
}


def clean_variation(x: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    return CLEAN_FUNCTIONS[kind](x, rng)


def wide_crop(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A crop keeping 50–70% of the side: another framing of the scene (a clean group's
    member, where 80–100% crops are near-duplicates)."""
    return crop(x, rng, keep=(0.5, 0.7))
