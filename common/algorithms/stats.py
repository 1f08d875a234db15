"""Confidence intervals for evaluation: means over prompts with a 95% bootstrap CI,
and paired differences of two models scored on the same prompts and noise.

The unit of resampling is the prompt (its samples share the prompt, so they are not
independent draws); the samples of one prompt are averaged first. Bootstrap via
scipy (percentile method: it stays defined for constant data such as a colour
criterion every sample meets, where BCa is not).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 4000


@dataclass(frozen=True)
class Interval:
    mean: float
    lo: float
    hi: float
    n: int  # prompts

    def as_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "lo": self.lo, "hi": self.hi, "n": self.n}

    def excludes_zero(self) -> bool:
        return self.lo > 0 or self.hi < 0


def per_prompt_means(values, num_prompts: int) -> np.ndarray:
    """[num_prompts · n] samples listed prompt by prompt → [num_prompts] means."""
    arr = np.asarray(values, dtype=np.float64)
    if num_prompts < 1 or arr.size % num_prompts:
        raise ValueError(f"{arr.size} samples do not split evenly over {num_prompts} prompts")
    return arr.reshape(num_prompts, -1).mean(axis=1)


def bootstrap_mean(
    values, *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0
) -> Interval:
    """Mean of ``values`` (one per prompt) with a percentile-bootstrap CI."""
    from scipy.stats import bootstrap

    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"expected a non-empty 1-D array of per-prompt values, got {arr.shape}")
    mean = float(arr.mean())
    if arr.size == 1 or np.ptp(arr) == 0:
        return Interval(mean, mean, mean, int(arr.size))
    res = bootstrap(
        (arr,),
        np.mean,
        confidence_level=confidence,
        n_resamples=resamples,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    ci = res.confidence_interval
    return Interval(mean, float(ci.low), float(ci.high), int(arr.size))


def paired_difference(model_values, base_values, **kw) -> Interval:
    """Mean of per-prompt (model − base) differences with its bootstrap CI: both
    models were scored on the same prompts with the same noise."""
    a, b = np.asarray(model_values, np.float64), np.asarray(base_values, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired values differ in shape: {a.shape} vs {b.shape}")
    return bootstrap_mean(a - b, **kw)


def across_seeds(values, *, confidence: float = CONFIDENCE) -> Interval:
    """Mean over training seeds with a Student-t CI (3 seeds are too few to bootstrap)."""
    from scipy import stats

    arr = np.asarray(values, dtype=np.float64)
    mean = float(arr.mean())
    if arr.size < 2 or np.ptp(arr) == 0:
        return Interval(mean, mean, mean, int(arr.size))
    half = float(stats.sem(arr) * stats.t.ppf(0.5 + confidence / 2, arr.size - 1))
    return Interval(mean, mean - half, mean + half, int(arr.size))


def seed_summary(values, *, paired: bool = False) -> dict | None:
    """:func:`across_seeds` as a dict (None without values). A paired per-seed
    difference (``paired``, 2 seeds at least) also gives ``seeds_to_resolve``."""
    if len(values) == 0:
        return None
    out = across_seeds(values).as_dict()
    if paired and len(values) >= 2:
        out["seeds_to_resolve"] = seeds_to_resolve(values)
    return out


def seeds_to_resolve(values, *, confidence: float = CONFIDENCE, most: int = 10_000) -> int | None:
    """How many seeds a per-seed difference needs before its t-CI excludes zero, if the
    seeds went on as these did (same mean, same standard deviation): the smallest n
    with t(n−1) · sd / √n < |mean|. None when the observed mean is zero (no number of
    seeds resolves it) or it would take more than ``most``; needs 2 values at least."""
    from scipy import stats

    arr = np.asarray(values, dtype=np.float64)
    if arr.size < 2:
        raise ValueError(f"the seed variance needs 2 seeds at least, got {arr.size}")
    mean, sd = abs(float(arr.mean())), float(arr.std(ddof=1))
    if sd == 0:
        return 2 if mean > 0 else None
    if mean == 0:
        return None
    q = 0.5 + confidence / 2
    # t(n−1) > z, so n is at least the normal approximation (z·sd/mean)²: start there
    start = max(2, int((stats.norm.ppf(q) * sd / mean) ** 2))
    for n in range(start, most + 1):
        if stats.t.ppf(q, n - 1) * sd / np.sqrt(n) < mean:
            return n
    return None
