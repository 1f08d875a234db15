"""The image-health measures on images whose answers are known, and the trained-vs-held-out
drift of a row (train.guard's rule logic: tests/test_guard.py)."""

import math

import numpy as np
import pytest
from g2rpo.common.health import image_health as H
from g2rpo.common.prompts.shapes import parse_prompt, render_batch
from g2rpo.evaluation.evaluate import split_prompts
from g2rpo.run_directory.eval_rows import drift_entries, eval_row, held_out_metrics


def _flat(n=2, size=32, rgb=(120, 60, 200)):
    return np.broadcast_to(np.array(rgb, np.uint8), (n, size, size, 3)).copy()


def test_a_flat_image_has_no_texture_and_a_checkerboard_is_all_texture():
    flat = _flat()
    assert np.array_equal(H.high_freq(flat), [0.0, 0.0])
    assert np.array_equal(H.periodicity(flat), [0.0, 0.0])
    yy, xx = np.mgrid[:32, :32]
    board = np.where(((yy + xx) % 2 == 0)[None, :, :, None], 255, 0).astype(np.uint8)
    board = np.repeat(board, 3, axis=-1)
    # all of its power is at (0.5, 0.5) cycles per pixel, above the cutoff
    assert H.high_freq(board)[0] == pytest.approx(1.0)
    # the real FFT's half-plane counts as the full spectrum does: a mix of a fast wave
    # along y and a slow one along x, of equal power, is half high-frequency
    yy, xx = np.mgrid[:64, :64]
    mix = 127.5 + 60 * np.sin(2 * np.pi * 0.375 * yy) + 60 * np.sin(2 * np.pi * 0.0625 * xx)
    mix = np.repeat(np.rint(mix).astype(np.uint8)[None, :, :, None], 3, axis=-1)
    assert H.high_freq(mix)[0] == pytest.approx(0.5, abs=0.03)
    # a smooth ramp puts nearly all of its power below it
    ramp = np.repeat(np.linspace(0, 255, 32)[None, None, :, None], 32, 1).astype(np.uint8)
    assert H.high_freq(np.repeat(ramp, 3, axis=-1))[0] < 0.01


def test_dots_on_the_shapes_world_raise_texture_and_periodicity_over_its_true_images():
    truth = render_batch([parse_prompt(p) for p in split_prompts("held_out", 20)], seed=7)
    yy, xx = np.mgrid[:32, :32]
    dotted = truth.astype(np.float64)
    dotted[:, (yy % 4 == 1) & (xx % 4 == 1)] *= 0.6  # a faint dot grid of period 4
    dotted = dotted.astype(np.uint8)
    clean, hacked = H.per_image(truth), H.per_image(dotted)
    rise = hacked["high_freq"] - clean["high_freq"]
    assert (rise > 0.01).all() and rise.mean() > 0.05
    assert (hacked["periodicity"] > clean["periodicity"]).mean() >= 0.9
    assert np.array_equal(hacked["saturation"] > 0, clean["saturation"] > 0)


def test_saturation_thumbnails_and_the_distances_against_the_base():
    red, grey = _flat(rgb=(255, 0, 0)), _flat(rgb=(128, 128, 128))
    assert np.allclose(H.saturation(red), 1.0) and np.allclose(H.saturation(grey), 0.0)
    assert H.saturation(np.zeros((1, 16, 16, 3), np.uint8))[0] == 0.0  # black: no NaN
    # area means over near-equal cells: a 2x2 block image of a 32² image
    img = np.zeros((1, 32, 32, 3), np.uint8)
    img[:, :16, :16] = 200
    thumb = H.thumbnails(img, size=2)
    assert thumb[0, 0, 0, 0] == 200 and thumb[0, 1, 1, 0] == 0
    assert H.thumbnails(np.zeros((3, 50, 70, 3), np.uint8)).shape == (3, 16, 16, 3)
    black, white = H.thumbnails(_flat(rgb=(0, 0, 0))), H.thumbnails(_flat(rgb=(255,) * 3))
    assert np.allclose(H.base_distance(white, black), 1.0)
    assert np.allclose(H.background_shift(white, black), math.sqrt(3))
    assert np.allclose(H.base_distance(black, black), 0.0)
    # diversity: two prompts of two samples, the first pair identical, the second opposite
    pair = np.concatenate([black, white])
    four = np.concatenate([black[:1], black[:1], pair[1:3]])
    assert np.allclose(H.diversity(four, 2), [0, 0, 1, 1])
    assert np.isnan(H.diversity(four, 1)).all()
    data = H.encode_thumbnails(four)
    assert np.array_equal(H.decode_thumbnails(data), four)
    with pytest.raises(ValueError, match="prompts or samples changed"):
        H.against_base(four, four[:2], 2)


def _grey(y: np.ndarray) -> np.ndarray:
    """uint8 [1, H, W, 3] of a grey image (luminance = the value) from [H, W] in 0..255."""
    g = np.clip(np.rint(y), 0, 255).astype(np.uint8)
    return np.repeat(g[None, :, :, None], 3, axis=-1)


def _grating(size: int, period: float, amp: float = 100.0) -> np.ndarray:
    """A sinusoidal grating along x: all its power at 1/period cycles per px, on the axis."""
    return _grey(
        np.broadcast_to(127.5 + amp * np.cos(2 * np.pi * np.arange(size) / period), (size, size))
    )


def _photo(name: str) -> np.ndarray:
    import skimage.data

    x = getattr(skimage.data, name)()
    return np.repeat(x[..., None], 3, axis=-1) if x.ndim == 2 else x


def _add(img: np.ndarray, pattern: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(img.astype(np.float64) + pattern[..., None]), 0, 255).astype(np.uint8)


def test_a_grating_puts_its_power_on_its_side_of_each_cutoff():
    """Catches: no patch bands before (high_freq_p8/p16), and the cutoff bin's side: a
    16-px grating's fundamental counts in p16 (5/6 of it: the Hann window spreads 1/6 into
    the bin below the cutoff), an 8-px one in p8."""
    m = H.per_image(np.concatenate([_grating(256, 256 / 48), _grating(256, 256 / 24)]))
    assert m["high_freq"] == pytest.approx([0, 0], abs=1e-3)  # 0.1875, 0.094 cycles/px
    assert m["high_freq_p8"] == pytest.approx([1, 0], abs=1e-3)
    assert m["high_freq_p16"] == pytest.approx([1, 1], abs=1e-3)
    on_cutoff = H.per_image(np.concatenate([_grating(256, 16), _grating(256, 8)]))
    assert on_cutoff["high_freq_p16"] == pytest.approx([5 / 6, 1], abs=0.01)
    assert on_cutoff["high_freq_p8"] == pytest.approx([0, 5 / 6], abs=0.01)
    # a 16-px grid of lines (a patch grid's seams) on both axes: nearly all in p16
    yy, xx = np.mgrid[:512, :512]
    grid = _grey(np.where((yy % 16 == 0) | (xx % 16 == 0), 200.0, 100.0))
    assert H.high_freq_patch(grid, 1 / 16)[0] > 0.95


def test_stripes_and_a_faint_grid_on_the_axes_raise_periodicity_and_edges_do_not():
    """Catches: the old periodicity dropped the axes, where an upright stripe pattern or a
    grid puts all its peaks; and compared a bin with its ring's mean, so a photo's own
    edges (ridges on the axes) would read as peaks once the axes count."""
    yy, xx = np.mgrid[:512, :512]
    stripes = 3.0 * np.cos(2 * np.pi * xx / 16)
    grid = 2.0 * (np.cos(2 * np.pi * xx / 16) + np.cos(2 * np.pi * yy / 16))
    rises = []
    for name in ("coffee", "rocket", "retina"):
        photo = _photo(name)
        top, left = (photo.shape[0] - 400) // 2, (photo.shape[1] - 400) // 2
        photo = photo[top : top + 400, left : left + 400]
        p = H.periodicity(np.stack([photo, *(_add(photo, x[:400, :400]) for x in (stripes, grid))]))
        rises.append(p[1:] - p[0])
    # where the photo's own power at 1/16 cycles/px is far above a few grey levels' (its
    # texture there), no spectral measure sees them: a rise on average, no fall
    assert (np.array(rises) > -0.01).all() and (np.mean(rises, axis=0) > 0.3).all()
    # a 16-px grid in one quarter of a 1024² image reads as over the whole (max over tiles)
    big = np.repeat(np.repeat(_photo("retina")[200:712, 200:712], 2, 0), 2, 1)
    part = np.zeros((1024, 1024))
    part[:512, :512] = np.tile(grid[:16, :16], (32, 32))
    whole = np.tile(grid[:16, :16], (64, 64))
    p = H.periodicity(np.stack([big, _add(big, part), _add(big, whole)]))
    assert p[1] > p[0] + 1 and p[1] == pytest.approx(p[2], abs=0.3)
    # brick: strong straight edges; a crop and a rescale move it little
    from skimage.transform import rescale

    brick = _photo("brick")
    small = np.rint(rescale(brick, 0.75, channel_axis=-1) * 255).astype(np.uint8)
    base = H.periodicity(brick[None])[0]
    for other in (brick[64:-64, 64:-64], small):
        assert abs(H.periodicity(other[None])[0] - base) < 0.35


def test_sharpness_and_contrast_have_their_hand_computed_values():
    """Catches: no contrast or sharpness before. A period-2 checkerboard of 0 and 1:
    every interior Laplacian is ±4 (four neighbours of the other level), variance 16."""
    yy, xx = np.mgrid[:32, :32]
    board = _grey(255.0 * ((yy + xx) % 2))
    assert H.sharpness(board)[0] == pytest.approx(np.log10(16.0), abs=1e-5)
    # two levels 0.2 and 0.8, a quarter at the upper: std = 0.6·√(1/4 · 3/4)
    two = _grey(np.where(yy < 8, 204.0, 51.0))
    assert H.contrast(two)[0] == pytest.approx(0.6 * np.sqrt(3 / 16), abs=1e-4)
    # an unsharp mask (image + (image − its 3×3 blur)) raises sharpness
    photo = _photo("astronaut")[None]
    y = photo.astype(np.float64)
    blur = sum(np.roll(np.roll(y, i, 1), j, 2) for i in (-1, 0, 1) for j in (-1, 0, 1)) / 9
    sharpened = np.clip(np.rint(2 * y - blur), 0, 255).astype(np.uint8)
    assert H.sharpness(sharpened)[0] > H.sharpness(photo)[0] + 0.2


def _caption(img: np.ndarray) -> np.ndarray:
    """White lines of text over the image's lowest quarter, PIL's default font."""
    from PIL import Image, ImageDraw, ImageFont

    im = Image.fromarray(img)
    draw, font = ImageDraw.Draw(im), ImageFont.load_default()
    h = img.shape[0]
    for y in range(h - h // 4, h - 15, 15):
        line = "SAMPLE WATERMARK stock image 0123456789 do not copy (c) 2026 licensed"
        draw.text((4, y), line, fill=(255, 255, 255), font=font)
    return np.asarray(im)


def test_glyph_area_sees_a_caption_and_not_natural_photos():
    """Catches: no glyph measure before. Seven photos read under 1%; a caption over the
    lowest quarter of five of them over 4% (white text: on immunohistochemistry's
    light ground it has little contrast)."""
    names = ["astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field"]
    for name in [*names, "immunohistochemistry", "retina"]:
        assert H.glyph_area(_photo(name)[None])[0] < 0.01, name
    for name in names:
        assert H.glyph_area(_caption(_photo(name))[None])[0] > 0.04, name


def test_chunks_give_one_batch_s_values_and_a_flat_image_is_finite():
    """Catches: the new measures' names and order, a chunk that changes a value, and a
    NaN on a flat image (a zero variance in a ratio or a log)."""
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (5, 300, 280, 3), dtype=np.uint8)
    whole, chunked = H.per_image(imgs), H.per_image(imgs, chunk=2)
    assert tuple(whole) == H.PER_IMAGE and len(H.PER_IMAGE) == 8
    for name in H.PER_IMAGE:
        np.testing.assert_allclose(whole[name], chunked[name], rtol=1e-9, err_msg=name)
    for size in (32, 512):
        flat = H.per_image(_flat(2, size))
        assert all(np.isfinite(v).all() for v in flat.values())
        assert flat["high_freq"].tolist() == flat["periodicity"].tolist() == [0.0, 0.0]
        assert flat["contrast"].tolist() == flat["glyph_area"].tolist() == [0.0, 0.0]
        assert flat["sharpness"] == pytest.approx([-8.0, -8.0])


def _row(**changes):
    """An evaluation row: for each metric (mean, lo, hi) of its paired change."""
    row = {"iteration": 3}
    for name, (mean, lo, hi) in changes.items():
        row |= {f"eval/{name}": 0.5, f"eval/{name}/delta": mean}
        row |= {f"eval/{name}/delta_lo": lo, f"eval/{name}/delta_hi": hi}
    return row


def test_drift_diverges_only_when_the_trained_reward_rises_and_a_held_out_one_falls():
    row = _row(
        shapes_clip=(0.02, 0.01, 0.03),
        shapes_oracle=(-0.1, -0.2, -0.05),
        **{"shapes_oracle/pass": (-0.1, -0.2, 0.0), "health/high_freq": (0.1, 0.05, 0.2)},
    )
    assert held_out_metrics(row, {"shapes_clip": 1}) == ["shapes_oracle", "shapes_oracle/pass"]
    drift = drift_entries(row, {"shapes_clip": 1.0})
    assert drift["eval/drift/diverging"] == 1.0 and drift["eval/drift/shapes_oracle"] == -0.1
    # the trained reward's CI reaches 0: no divergence
    row["eval/shapes_clip/delta_lo"] = -0.001
    assert drift_entries(row, {"shapes_clip": 1.0})["eval/drift/diverging"] == 0.0
    # paid for its score to fall (weight -1): a fall is its gain
    row["eval/shapes_clip/delta_hi"] = -0.001
    assert drift_entries(row, {"shapes_clip": -1.0})["eval/drift/diverging"] == 1.0
    # trained on the checker: its pass rate is a part of a trained reward, not held out
    assert held_out_metrics(row, {"shapes_oracle": 1}) == ["shapes_clip"]
    assert drift_entries(row, {"shapes_clip": 1, "shapes_oracle": 1}) == {}  # nothing held out


def test_health_values_get_paired_changes_against_the_first_evaluation():
    first = {
        "prompts": ["a", "b"],
        "scores": {"r": [0.0, 0.0, 1.0, 1.0]},
        "health": {"high_freq": [0.1, 0.1, 0.2, 0.2]},
    }
    values = {"r": np.array([0.0, 0.0, 1.0, 1.0]), "health/high_freq": np.full(4, 0.5)}
    row = eval_row(values, first, per_prompt=2)
    assert row["eval/r/delta"] == 0.0
    assert row["eval/health/high_freq/delta"] == pytest.approx(0.35)
    assert row["eval/health/high_freq/delta_lo"] == pytest.approx(0.3)


def test_eval_health_against_a_base_reads_the_base_measures_once(monkeypatch):
    from g2rpo.evaluation.eval_outputs import split_summary
    from g2rpo.evaluation.evaluate import SplitSamples

    calls = []
    measure = H.per_image
    monkeypatch.setattr(H, "per_image", lambda im: calls.append(len(im)) or measure(im))
    red, blue = _flat(4, rgb=(255, 0, 0)), _flat(4, rgb=(0, 0, 255))
    values = {"r": np.zeros(4)}
    base = SplitSamples("held_out", ["a", "b"], 2, red, values)
    # two models compared with one base, as `g2rpo compare` does
    for model_images in (red.copy(), blue):
        model = SplitSamples("held_out", ["a", "b"], 2, model_images, values)
        health = split_summary(model, base)["health"]
    assert calls == [4, 4, 4]  # each model once, the base once
    # blue against red: every border cell moved by (−1, 0, +1), √2 in colour, 2/3 in mean |Δ|
    assert health["metrics"]["background_shift"]["mean"] == pytest.approx(math.sqrt(2))
    assert health["vs_base"]["base_distance"]["mean"] == pytest.approx(2 / 3)
    assert health["vs_base"]["diversity"]["mean"] == 0.0
