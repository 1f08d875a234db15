"""``train.guard``'s rules when a config gives none, by the image size it trains at: the
measures' scales differ between the tiny world's 32² shapes and 512²–1024² photographs
(a 16-px grid is 1/16 cycles per pixel at any size; a texture's share of the spectrum is
not). Each set says where its thresholds come from; a run's own clean run fits better
(``g2rpo guard calibrate RUN``)."""

from __future__ import annotations

from .config_guard import GuardRule

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


def photograph_rules() -> list[GuardRule]:
    """Thresholds fitted on clean variations (crops, rescales, colour and exposure jitter,
    JPEG) of natural photographs at 512²–1024² (docs/results/hacking/photos: the choosing
    photographs' 98th-percentile change, judged on the others), one rule per measure in
    the direction its hack moves it; change measures against the base as in the tiny world."""
    return [
        GuardRule(signal="health/saturation", rises_rel=0.15),
        GuardRule(signal="health/contrast", rises_rel=0.15),
        GuardRule(signal="health/sharpness", rises_by=0.15),
        GuardRule(signal="health/high_freq", rises_by=0.02),
        GuardRule(signal="health/high_freq_p16", rises_by=0.03),
        GuardRule(signal="health/periodicity", rises_by=0.3),
        GuardRule(signal="health/glyph_area", rises_by=0.02),
        GuardRule(signal="health/background_shift", rises_by=0.05),
        GuardRule(signal="health/diversity", falls_by=0.03),
        GuardRule(signal="health/diversity_embed", falls_by=0.05),
        GuardRule(signal="drift/diverging", above=0.5),
    ]


def default_rules(image_size: int | None = None) -> list[GuardRule]:
    """The rules for images of ``image_size`` px a side (None: the tiny world's)."""
    if image_size is not None and image_size >= PHOTO_SIDE:
        return photograph_rules()
    return tiny_world_rules()
