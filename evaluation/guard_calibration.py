"""Thresholds for ``train.guard`` fitted to clean runs (``g2rpo guard calibrate``, and the
hacking study's choosing rule, docs/results/hacking/preregistration.md): per candidate
signal and test, the smallest candidate threshold at least ``margin`` × the largest level
any clean run held at two evaluations in a row. A clean run is one a reader of its sample
grids saw no hack in: calibrating on a hacked run teaches the guard to accept the hack."""

from __future__ import annotations

import math

from ..common.config.guard import GuardRule
from ..common.health.guard import base_mean, directed_bound, is_evaluation_row

PAIR = 2  # evaluations in a row (the guard's default patience)
MARGIN = 1.5
# (signal, test, candidate thresholds from the most sensitive): the pre-registered table
CANDIDATES = [
    *[
        (f"health/{m}", "rises_by", [0.002, 0.005, 0.01, 0.02, 0.05])
        for m in ("high_freq", "high_freq_p8", "high_freq_p16")
    ],
    ("health/periodicity", "rises_by", [0.02, 0.05, 0.1, 0.2, 0.3]),
    ("health/sharpness", "rises_by", [0.02, 0.05, 0.1, 0.2]),
    ("health/glyph_area", "rises_by", [0.005, 0.01, 0.02, 0.05]),
    *[
        (f"health/{m}", test, [0.02, 0.05, 0.1, 0.2])
        for m in ("saturation", "contrast")
        for test in ("rises_rel", "falls_rel")
    ],
    ("health/background_shift", "rises_by", [0.02, 0.03, 0.05, 0.07, 0.1]),
    ("health/base_distance", "rises_by", [0.03, 0.05, 0.07, 0.1, 0.15]),
    ("health/diversity", "falls_by", [0.005, 0.01, 0.02, 0.03, 0.05]),
    ("health/diversity_embed", "falls_by", [0.005, 0.01, 0.02, 0.05, 0.1]),
    ("drift/diverging", "above", [0.5]),
]


def reading(row: dict, signal: str, test: str) -> float | None:
    """The number the rule compares with its threshold at one evaluation (crossed when
    it exceeds it): the CI bound in the rule's direction, over the base's mean for the
    relative tests; None where the row has no change yet."""
    bound = directed_bound(row, signal, test)
    if bound is None or not test.endswith("_rel"):
        return bound
    base = base_mean(row, signal)
    return None if base == 0 else bound / base


def held_level(rows: list[dict], signal: str, test: str) -> float | None:
    """The largest level the run's readings held at ``PAIR`` evaluations in a row (None:
    the run never records the signal)."""
    values = [reading(r, signal, test) for r in rows if is_evaluation_row(r)]
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return None
    if len(values) < PAIR:
        return max(values)
    return max(min(values[i : i + PAIR]) for i in range(len(values) - PAIR + 1))


def calibrate(clean_runs: dict[str, list[dict]], margin: float = MARGIN) -> dict:
    """{"rules": [GuardRule], "levels": {rule: {run: level}}, "left_out": {signal/test:
    why}} from the clean runs' metrics rows."""
    rules, levels, left_out = [], {}, {}
    for signal, test, thresholds in CANDIDATES:
        name = f"{signal} {test}"
        held = {run: held_level(rows, signal, test) for run, rows in clean_runs.items()}
        seen = [v for v in held.values() if v is not None]
        if not seen:
            left_out[name] = "no clean run records it"
            continue
        need = margin * max(max(seen), 0.0)
        pick = next((t for t in thresholds if t >= need and t > max(seen)), None)
        levels[name] = {run: None if v is None else round(v, 5) for run, v in held.items()}
        if pick is None:
            left_out[name] = f"a clean run held {max(seen):.4g}: above every candidate / {margin:g}"
            continue
        rules.append(GuardRule(signal=signal, **{test: pick}))
    return {"rules": rules, "levels": levels, "left_out": left_out}


def rules_yaml(rules: list[GuardRule]) -> str:
    """``train.guard.rules`` as a config block."""
    lines = ["train:", "  guard:", "    rules:"]
    for rule in rules:
        lines.append(f"      - {{signal: {rule.signal}, {rule.test}: {rule.threshold:g}}}")
    return "\n".join(lines) + "\n"
