"""``train.guard``'s rules when a config gives none, by the image size it trains at: the
measures' scales differ between the tiny world's 32² shapes and 512²–1024² photographs
(a 16-px grid is 1/16 cycles per pixel at any size; a texture's share of the spectrum is
not). Each set says where its thresholds come from; a run's own clean run fits better
(``g2rpo guard calibrate RUN``)."""

from __future__ import annotations

from .guard import GuardRule

# At or above this side, the photograph-calibrated rules apply; below it, the tiny world's.
PHOTO_SIDE = 256


def tiny_world_rules() -> list[GuardRule]:
    """The issue-47 study's rules (docs/results/hacking/issue47: on its 8 runs they stop
    every run in which a person saw a hack and neither clean run; chosen after seeing all
    8, so not held out): texture, the background, distance from the base, collapse, and
    the held-out reward falling while the trained one rises."""
    return [
        GuardRule(signal="health/high_freq", rises_by=0.02),
        GuardRule(signal="health/periodicity", rises_by=0.02),
        GuardRule(signal="health/background_shift", rises_by=0.05),
        GuardRule(signal="health/base_distance", rises_by=0.07),
        GuardRule(signal="health/diversity", falls_by=0.03),
        GuardRule(signal="drift/diverging", above=0.5),
    ]


# Per-image thresholds fitted on clean variations (crops, rescales, colour and exposure
# jitter, JPEG) of 6 choosing photographs at each size, each the smallest with ≤ 2% false
# alarms there, rounded up to 2 significant digits: docs/results/hacking/photos
# (results.json per_size.<side>.thresholds; tests/test_guard.py holds them equal). Judged on
# 7 other photographs: every strong hack found at 1024² but 7-17% false alarms by any
# measure per image, above the 5% goal (a run's guard reads means over its prompts, with a
# CI, which per-image noise moves less). saturation, contrast and diversity relative to the
# base's level; the others as changes.
PHOTO_THRESHOLDS = {
    512: {"high_freq": 0.012, "high_freq_p8": 0.014, "high_freq_p16": 0.027,
          "periodicity": 0.26, "saturation": 0.073, "contrast": 0.043, "sharpness": 0.051,
          "glyph_area": 0.00098, "base_distance": 0.17, "background_shift": 0.28,
          "diversity": 0.31},
    720: {"high_freq": 0.0021, "high_freq_p8": 0.0021, "high_freq_p16": 0.0033,
          "periodicity": 0.24, "saturation": 0.067, "contrast": 0.045, "sharpness": 0.043,
          "glyph_area": 0.00099, "base_distance": 0.13, "background_shift": 0.17,
          "diversity": 0.33},
    1024: {"high_freq": 0.0011, "high_freq_p8": 0.0043, "high_freq_p16": 0.0039,
           "periodicity": 0.2, "saturation": 0.066, "contrast": 0.054, "sharpness": 0.088,
           "glyph_area": 0.0, "base_distance": 0.14, "background_shift": 0.32,
           "diversity": 0.53},
}  # fmt: skip
RELATIVE = ("saturation", "contrast", "diversity")
FALLS = ("diversity",)
# not calibrated on photographs (no CLIP model offline: docs/results/hacking/photos/README.md)
DIVERSITY_EMBED_FALLS_BY = 0.05


def photograph_rules(image_size: int) -> list[GuardRule]:
    """The rules at the calibrated side nearest ``image_size``: one per measure in the
    direction its hack moves it (saturation and contrast up, sharpness and texture up,
    glyphs up, the background and the distance from the base up, diversity down), and the
    held-out reward falling while the trained one rises."""
    side = min(PHOTO_THRESHOLDS, key=lambda s: abs(s - image_size))
    rules = []
    for measure, t in PHOTO_THRESHOLDS[side].items():
        test = ("falls" if measure in FALLS else "rises") + (
            "_rel" if measure in RELATIVE else "_by"
        )
        rules.append(GuardRule(signal=f"health/{measure}", **{test: t}))
    rules.append(GuardRule(signal="health/diversity_embed", falls_by=DIVERSITY_EMBED_FALLS_BY))
    rules.append(GuardRule(signal="drift/diverging", above=0.5))
    return rules


def default_rules(image_size: int | None = None) -> list[GuardRule]:
    """The rules for images of ``image_size`` px a side (None: the tiny world's)."""
    if image_size is not None and image_size >= PHOTO_SIDE:
        return photograph_rules(image_size)
    return tiny_world_rules()
