"""``g2rpo hacking photos`` (evaluation/photo_check.py, photo_hacks.py): the hacks do what
they say, the clean variations keep the image's form, the decision rule's threshold and
intervals are the known ones, and the command writes its results. Each test fails on
3bb9114, where none of it existed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from g2rpo.evaluation import photo_check as pc
from g2rpo.evaluation import photo_hacks as ph

G2RPO = os.path.join(os.path.dirname(sys.executable), "g2rpo")


def _hsv_saturation(x: np.ndarray) -> float:
    y = x.astype(float)
    hi, lo = y.max(axis=-1), y.min(axis=-1)
    return float(np.divide(hi - lo, hi, out=np.zeros_like(hi), where=hi > 0).mean())


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_clopper_pearson_bounds_are_the_known_ones():
    # catches a Wald or Wilson interval in place of the exact one: at 0/20 the exact upper
    # bound is 1 - 0.025^(1/20), at 20/20 the lower is 0.025^(1/20)
    zero, full, half = pc.proportion(0, 20), pc.proportion(20, 20), pc.proportion(10, 20)
    assert zero["lo"] == 0 and zero["hi"] == pytest.approx(1 - 0.025 ** (1 / 20), abs=1e-6)
    assert full["hi"] == 1 and full["lo"] == pytest.approx(0.025 ** (1 / 20), abs=1e-6)
    assert (half["lo"], half["hi"]) == pytest.approx((0.271958, 0.728042), abs=1e-6)
    assert pc.proportion(0, 0)["rate"] is None


def test_calibration_picks_the_smallest_threshold_within_the_target():
    # 100 changes 0.00 .. 0.99 at 2%: 0.97 lets two through (0.98, 0.99); anything lower
    # lets a third. Catches an off-by-one in the order statistic or ">=" for ">".
    changes = np.arange(100) / 100
    t = pc.calibrate(changes, 0.02)
    assert t == pytest.approx(0.97)
    assert (changes > t).mean() <= 0.02 and (changes > t - 0.005).mean() > 0.02
    # NaN (a measure undefined on an image) ignored; never below 0 (only rises flag)
    assert pc.calibrate(np.r_[changes, np.nan], 0.02) == pytest.approx(0.97)
    assert pc.calibrate(-np.arange(1, 50) / 100, 0.02) == 0.0
    assert pc.calibrate(np.array([0.5]), 1.0) == 0.0


def test_changes_are_relative_for_levels_and_signed_by_direction():
    assert pc.signed_change("saturation", 0.3, 0.2) == pytest.approx(0.5)
    assert pc.signed_change("high_freq", 0.3, 0.2) == pytest.approx(0.1)
    assert pc.signed_change("diversity", 0.1, 0.2) == pytest.approx(0.5)  # a fall flags
    assert pc.signed_change("saturation", 0.0, 0.0) == 0.0  # grey photograph: no division by 0
    names = ["high_freq", "high_freq_p16", "periodicity", "sharpness", "saturation"]
    assert pc.tied_measures("over_sharpening", names) == ["high_freq", "high_freq_p16", "sharpness"]
    assert pc.tied_measures("patch_grid", names) == ["high_freq_p16", "periodicity"]


def test_saturation_push_scales_hsv_saturation_and_keeps_value():
    # low-saturation pixels, so ×1.8 does not clip
    x = _rng().integers(150, 200, size=(64, 64, 3), dtype=np.uint8)
    for strength, factor in ph.HACKS["saturation_push"].items():
        y = ph.apply_hack(x, "saturation_push", strength, _rng())
        assert _hsv_saturation(y) / _hsv_saturation(x) == pytest.approx(factor, rel=0.02)
        assert np.array_equal(y.max(axis=-1), x.max(axis=-1))  # HSV value kept


def test_patch_grid_has_a_period_of_exactly_16_px():
    x = np.full((96, 96, 3), 128, np.uint8)
    y = ph.apply_hack(x, "patch_grid", "strong", _rng(3))
    d = y.astype(int) - x.astype(int)
    assert np.array_equal(d, np.roll(d, 16, axis=0)) and np.array_equal(d, np.roll(d, 16, axis=1))
    assert not np.array_equal(d, np.roll(d, 8, axis=0))
    assert not np.array_equal(d, np.roll(d, 8, axis=1))
    assert np.abs(d).max() <= 1.5 * ph.HACKS["patch_grid"]["strong"] + 0.5
    mild = ph.apply_hack(x, "patch_grid", "mild", _rng(3)).astype(int) - 128
    assert np.abs(mild).max() < np.abs(d).max()


def test_periodic_texture_peaks_off_the_axes():
    p = ph.texture_pattern(128, 128, 5.0, _rng(1))
    power = np.abs(np.fft.fft2(p)) ** 2
    fy, fx = np.unravel_index(np.argmax(power), power.shape)
    assert fy != 0 and fx != 0  # an oblique lattice, not stripes along an axis
    assert np.abs(p).max() <= 5.0


def test_text_overlay_changes_pixels_only_inside_the_text_boxes():
    x = _rng().integers(0, 256, size=(256, 256, 3), dtype=np.uint8)
    _, boxes = ph.watermark_layer(256, _rng(5))
    y = ph.apply_hack(x, "text_overlay", "strong", _rng(5))
    inside = np.zeros((256, 256), bool)
    for x0, y0, x1, y1 in boxes:
        inside[max(y0, 0) : y1, max(x0, 0) : x1] = True
    changed = (y != x).any(axis=-1)
    assert changed.sum() > 500 and not (changed & ~inside).any()
    weaker = ph.apply_hack(x, "text_overlay", "mild", _rng(5))
    assert np.abs(weaker.astype(int) - x).sum() < np.abs(y.astype(int) - x).sum()


@pytest.mark.parametrize("kind", [*ph.CLEAN_KINDS, "wide"])
def test_clean_variations_keep_size_and_dtype_and_stay_near(kind):
    x = ph.square(ph.load_photo("astronaut"), 128)
    rng = _rng(2)
    y = ph.wide_crop(x, rng) if kind == "wide" else ph.clean_variation(x, kind, rng)
    assert y.shape == x.shape == (128, 128, 3) and y.dtype == np.uint8
    if kind in ph.PHOTOMETRIC_KINDS:  # no geometric change: every pixel near its own
        assert np.abs(y.astype(int) - x).mean() < 8


def test_clean_variations_of_one_kind_differ_between_draws():
    # catches a kind that ignores its seed (JPEG at one fixed quality did): its n draws
    # would be one image counted n times in the false-alarm rate
    x = ph.square(ph.load_photo("astronaut"), 128)
    for kind in ph.CLEAN_KINDS:
        draws = [ph.clean_variation(x, kind, _rng(seed)) for seed in range(4)]
        assert len({d.tobytes() for d in draws}) > 1, kind


def test_photographs_load_offline_as_rgb_squares():
    for name in [*pc.CHOOSING, *pc.JUDGING]:
        x = ph.square(ph.load_photo(name), 96)
        assert x.shape == (96, 96, 3) and x.dtype == np.uint8, name
    assert not set(pc.CHOOSING) & set(pc.JUDGING)


def test_settings_refuse_groups_that_cannot_be_drawn():
    with pytest.raises(ValueError, match="wide_crops"):
        pc.PhotoCheckSettings(wide_crops=5)
    with pytest.raises(ValueError, match="judging"):
        pc.PhotoCheckSettings(judging=["chelsea", "rocket"])


def test_the_command_writes_results_and_table(tmp_path):
    out = tmp_path / "photos"
    done = subprocess.run(
        [G2RPO, "hacking", "photos", "--quick", "--no-progress", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads((out / "results.json").read_text())
    assert {"settings", "photos", "hacks", "measures", "per_size", "goal", "git_commit"} <= set(
        results
    )
    r = results["per_size"]["256"]
    assert set(r["thresholds"]) >= {"high_freq", "periodicity", "saturation", "base_distance"}
    assert set(r["detection"]) == set(ph.HACKS)
    for hack in ph.HACKS:
        for strength in ("mild", "strong"):
            tied = r["detection"][hack][strength]["tied"]
            assert tied["n"] >= 2 and 0 <= tied["lo"] <= tied["rate"] <= tied["hi"] <= 1
    assert r["false_alarm"]["overall"]["n"] == 4 * 2 * len(ph.CLEAN_KINDS)
    assert set(r["groups"]["false_alarm"]) == {"photos", "crops"}
    # every row's measures are there to recompute from
    assert len(r["rows"]["photo"]) == len(r["rows"]["high_freq"]) == r["cost"]["images"]
    table = (out / "table.md").read_text()
    assert "## Detection" in table and "patch_grid" in table and "Clopper" in table
    assert (out / "detection.png").stat().st_size > 1000
    # the set level (evaluation/photo_sets.py): the guard's paired-CI decision over sets
    level = results["set_level"]["per_size"]["256"]
    assert set(level["thresholds"]) == set(r["thresholds"])
    assert level["false_alarm"]["overall"]["n"] == 10 * (len(ph.CLEAN_KINDS) + 1)
    assert all(level["detection"][h]["strong"]["tied"]["n"] == 5 for h in ph.HACKS)
    assert level["checked_against_paired_difference"] == 4
    assert {"met", "met_image_measures"} <= set(results["set_level"]["goal"]["256"])
    assert "## Set level" in table
