"""The set level of ``g2rpo hacking photos``: the training guard's decision shape on the
photographs, beside the per-image level of evaluation/photo_check.py (which it leaves as is).

The guard (common/health/guard.py) judges no single image: per measure, at each evaluation,
the paired change of the mean over its prompts since the first evaluation, with its 95% CI
(run_directory/eval_rows.py, common/algorithms/stats.paired_difference); a rule is crossed
when the CI lies wholly above the threshold (``rises_by``; ``rises_rel``: a share of the
base's mean, for ``photo_check.RELATIVE``), and alarms at ``DRAWS`` in a row (patience 2).

A trial: a set of photographs for one evaluation's prompts, the base their originals; a
clean draw replaces each by a measured clean variation (one kind a trial, or ``mixed``), a
hacked draw by a hacked image; two draws of different images, flagged when both cross.
Thresholds: each the smallest keeping the CHOOSING photographs' clean trials at or below
``fa_target``; judged on the JUDGING photographs' trials, from another seed stream; all
from the per-image rows in results.json. Diversity stays per group."""

from __future__ import annotations

import time

import numpy as np
from g2rpo.common.algorithms.stats import CONFIDENCE, RESAMPLES, paired_difference
from g2rpo.evaluation import photo_check as pc
from g2rpo.evaluation import photo_hacks as ph
from g2rpo.evaluation import photo_rule
from pydantic import BaseModel, Field

DRAWS = 2  # the guard's default patience: crossed at 2 evaluations in a row
MIXED = "mixed"  # a clean trial whose photographs each get a variation of any kind
SET_STREAM = 16  # seed stream of the set draws (photo_check.STREAMS uses 1-5)
BOOTSTRAP_SEED = 0  # paired_difference's default, as eval_row calls it
CHUNK = 256  # rows bootstrapped at a time: 256 × 4000 × 7 floats stay near 60 MB


class SetLevelSettings(BaseModel):
    clean_trials: int = Field(50, ge=1, description="clean set trials per kind (and mixed)")
    hack_trials: int = Field(50, ge=1, description="hacked set trials per hack and strength")
    fa_target: float = Field(0.02, description="clean trials' false alarms each threshold keeps")
    checked: int = Field(
        24, ge=0, description="draws per size whose CI is recomputed by paired_difference itself"
    )

    @classmethod
    def quick(cls) -> SetLevelSettings:
        return cls(clean_trials=10, hack_trials=5, checked=4)


# -- the decision (pure) -----------------------------------------------------------------


def lower_bounds(diffs: np.ndarray) -> np.ndarray:
    """[rows, photos] paired differences → each row's lower 95% bound, exactly as
    common/algorithms/stats.paired_difference computes it (same scipy call and seed, so the same
    resample indices; constant rows give their value) but many rows per scipy call: the
    resamples index the last axis only, shared by every row."""
    from scipy.stats import bootstrap

    d = np.asarray(diffs, np.float64)
    lo = d.mean(axis=1)  # constant rows: bootstrap_mean returns the mean as both bounds
    varied = np.flatnonzero(np.ptp(d, axis=1) > 0)
    for start in range(0, len(varied), CHUNK):
        rows = varied[start : start + CHUNK]
        res = bootstrap(
            (d[rows],),
            np.mean,
            confidence_level=CONFIDENCE,
            n_resamples=RESAMPLES,
            method="percentile",
            vectorized=True,
            axis=-1,
            rng=np.random.default_rng(BOOTSTRAP_SEED),
        )
        lo[rows] = res.confidence_interval.low
    return lo


def crossing_statistic(lo: np.ndarray, base_mean: float, relative: bool) -> np.ndarray:
    """The largest threshold t ≥ 0 a draw still crosses (crossed ⇔ statistic > t): the CI's
    lower bound for ``rises_by``; for ``rises_rel`` the bound as a share of the base's mean
    (the guard compares lo > t·|base mean|; a base mean of 0 is crossed by any lo > 0)."""
    lo = np.asarray(lo, float)
    if not relative:
        return lo
    base = abs(base_mean)
    if base == 0:
        return np.where(lo > 0, np.inf, 0.0)
    return lo / base


def trial_statistic(draw_statistics: np.ndarray) -> np.ndarray:
    """[trials, DRAWS, ...] → [trials, ...]: a trial crosses t only when every draw does (the
    guard's patience), so its statistic is the smallest of its draws'."""
    return np.asarray(draw_statistics, float).min(axis=1)


def trial_flags(draw_statistics: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """[trials, DRAWS, measures] → [trials, measures]: flagged where every draw crosses."""
    return trial_statistic(draw_statistics) > np.asarray(thresholds, float)[None, :]


# -- the trials --------------------------------------------------------------------------


def _table(rows: dict, measures: list[str]) -> tuple[np.ndarray, dict]:
    """The rows' measures [images, measures] and each photograph's image indices by label."""
    values = np.array([rows[m] for m in measures], float).T
    index: dict = {}
    for i, (photo, kind, var, st) in enumerate(
        zip(rows["photo"], rows["kind"], rows["variation"], rows["strength"], strict=True)
    ):
        p = index.setdefault(photo, {"base": None, "clean": {}, "hack": {}})
        if kind == "base":
            p["base"] = i
        elif kind == "clean":
            p["clean"].setdefault(var, []).append(i)
        else:
            p["hack"].setdefault((var, st), []).append(i)
    return values, index


def _pool(entry: dict, variant: str, strength: str | None, photo: str) -> list[int]:
    """A photograph's images that a draw of ``variant`` picks from. A saturation push does
    nothing to a grey photograph (photo_hacks.applicable): in a hacked set it stays a clean
    variation of any kind, as the hacked images are hacks on one."""
    if strength is None:
        if variant == MIXED:
            return [i for k in ph.CLEAN_KINDS for i in entry["clean"][k]]
        return entry["clean"][variant]
    if not ph.applicable(variant, photo):
        return [i for k in ph.CLEAN_KINDS for i in entry["clean"][k]]
    return entry["hack"][(variant, strength)]


def draw_trials(
    index: dict, photos: list[str], variant: str, strength: str | None, n: int, rng
) -> np.ndarray:
    """[n, DRAWS, photos] image indices: each draw one image of each photograph, the DRAWS
    of a trial different images of it where its pool has enough (two evaluations sample
    anew)."""
    out = np.empty((n, DRAWS, len(photos)), int)
    for j, photo in enumerate(photos):
        pool = np.asarray(_pool(index[photo], variant, strength, photo))
        for t in range(n):
            out[t, :, j] = pool[rng.choice(len(pool), DRAWS, replace=len(pool) < DRAWS)]
    return out


def draw_statistics(
    picks: np.ndarray, values: np.ndarray, base: np.ndarray, measures: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """[trials, DRAWS, photos] picks → per draw and measure, the CI's lower bound and the
    crossing statistic ([trials, DRAWS, measures] each)."""
    sign = np.array([photo_rule.direction(m) for m in measures], float)
    diffs = (values[picks] - base[None, None]) * sign  # [trials, DRAWS, photos, measures]
    flat = np.moveaxis(diffs, 2, -1).reshape(-1, diffs.shape[2])
    lo = lower_bounds(flat).reshape(*picks.shape[:2], len(measures))
    base_mean = base.mean(axis=0)
    stat = np.stack(
        [
            crossing_statistic(lo[..., j], base_mean[j], m in pc.RELATIVE)
            for j, m in enumerate(measures)
        ],
        axis=-1,
    )
    return lo, stat


def _check(draws: dict, values: np.ndarray, bases: dict, measures: list[str], n: int, rng) -> int:
    """Recompute ``n`` random draws' lower bounds with
    common/algorithms/stats.paired_difference (the guard's function) and refuse to go on when
    one differs: the batched bootstrap must be that function."""
    keys = list(draws)
    for _ in range(n):
        key = keys[int(rng.integers(len(keys)))]
        (picks, lo), role = draws[key], key[0]
        t, d, j = (int(rng.integers(k)) for k in (*picks.shape[:2], len(measures)))
        sign = photo_rule.direction(measures[j])
        ref = paired_difference(sign * values[picks[t, d], j], sign * bases[role][:, j]).lo
        if not np.isclose(ref, lo[t, d, j], rtol=1e-9, atol=1e-12):
            raise RuntimeError(
                f"set level: batched CI bound {lo[t, d, j]} differs from paired_difference's "
                f"{ref} ({measures[j]}): report this as a bug"
            )
    return n


def _any_of(f: np.ndarray) -> dict:
    return pc.proportion(int(f.any(axis=1).sum()), len(f))


def judge_size(rows: dict, measures: list[str], size: int, seed: int, s: SetLevelSettings):
    """Thresholds on the choosing photographs' clean set trials; false alarms and detection
    on the judging photographs' set trials."""
    values, index = _table(rows, measures)
    roles = {
        role: list(
            dict.fromkeys(p for p, r in zip(rows["photo"], rows["set"], strict=True) if r == role)
        )
        for role in ("choosing", "judging")
    }
    bases = {role: values[[index[p]["base"] for p in photos]] for role, photos in roles.items()}
    clean_variants = [(k, None) for k in (*ph.CLEAN_KINDS, MIXED)]
    hack_variants = [(h, st) for h in ph.HACKS for st in ("mild", "strong")]
    stats, draws = {}, {}
    for ri, (role, photos) in enumerate(roles.items()):
        rng = np.random.default_rng([seed, SET_STREAM, size, ri])
        for variant, strength in clean_variants + (hack_variants if role == "judging" else []):
            n = s.clean_trials if strength is None else s.hack_trials
            picks = draw_trials(index, photos, variant, strength, n, rng)
            lo, stat = draw_statistics(picks, values, bases[role], measures)
            stats[(role, variant, strength)], draws[(role, variant, strength)] = stat, (picks, lo)
    checked = _check(draws, values, bases, measures, s.checked, np.random.default_rng(seed))

    def clean(role: str) -> np.ndarray:
        return np.concatenate([stats[(role, k, st)] for k, st in clean_variants])

    thresholds = {
        m: pc.calibrate(trial_statistic(clean("choosing"))[:, j], s.fa_target)
        for j, m in enumerate(measures)
    }
    t = np.array([thresholds[m] for m in measures])

    def by_measure(f: np.ndarray) -> dict:
        return {m: float(f[:, j].mean()) for j, m in enumerate(measures)}

    judged = clean("judging")
    false_alarm = {
        "overall": _any_of(trial_flags(judged, t)),
        "by_kind": {
            k: _any_of(trial_flags(stats[("judging", k, st)], t)) for k, st in clean_variants
        },
        "by_measure": by_measure(trial_flags(judged, t)),
        "one_draw": _any_of(judged[:, 0] > t[None, :]),  # patience 1, same thresholds
        "choosing_in_sample": _any_of(trial_flags(clean("choosing"), t)),
    }
    detection = {}
    for hack in ph.HACKS:
        tied = pc.tied_measures(hack, measures)
        cols = [measures.index(m) for m in tied]
        detection[hack] = {"tied_measures": tied}
        for strength in ("mild", "strong"):
            f = trial_flags(stats[("judging", hack, strength)], t)
            detection[hack][strength] = {
                "tied": pc.proportion(int(f[:, cols].any(axis=1).sum()) if cols else 0, len(f)),
                "any": _any_of(f),
                "by_measure": by_measure(f),
            }
    return {
        "photos": roles,
        "pool_images": {  # the images the trials resample: trials share them
            "clean_per_photo_and_kind": min(
                len(v) for p in index.values() for v in p["clean"].values()
            ),
            "hacked_per_photo": min(len(v) for p in index.values() for v in p["hack"].values()),
        },
        "thresholds": thresholds,
        "base_mean": {
            r: dict(zip(measures, b.mean(axis=0).tolist(), strict=True)) for r, b in bases.items()
        },
        "false_alarm": false_alarm,
        "detection": detection,
        "checked_against_paired_difference": checked,
    }


def goal(set_sizes: dict, per_image_goal: dict) -> dict:
    """The issue's goal at the set level: every image hack's strong set trials flagged by a
    tied measure with at most 5% false alarms on clean set trials; ``met`` also needs the
    diversity rule's figures, which stay per group (photo_check.goal's)."""
    out = {}
    for size, r in set_sizes.items():
        strong = {h: r["detection"][h]["strong"]["tied"]["rate"] for h in ph.HACKS}
        fa = r["false_alarm"]["overall"]["rate"]
        image = all(v == 1.0 for v in strong.values()) and fa <= 0.05
        g = per_image_goal[size]
        groups = g["strong_tied_detection"]["collapse"] == 1.0 and g["false_alarm_groups"] <= 0.05
        out[size] = {
            "strong_tied_detection": strong,
            "false_alarm": fa,
            "met_image_measures": image,
            "met": image and groups,
        }
    return out


def add_set_level(results: dict, s: SetLevelSettings) -> dict:
    """``results`` (photo_check.run_check's) with its set level under ``set_level``; its time
    is added to the command's ``wall_s`` and ``cpu_s``."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    measures = results["measures"]["names"]
    seed = results["settings"]["seed"]
    sizes = {
        size: judge_size(r["rows"], measures, int(size), seed, s)
        for size, r in results["per_size"].items()
    }
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    level = {
        "rule": (
            "per measure, the paired 95% CI (common/algorithms/stats.paired_difference, "
            f"{RESAMPLES} resamples, seed {BOOTSTRAP_SEED}) of (variant − base) over a set's "
            "photographs "
            "wholly above the threshold (relative to the base's mean for "
            f"{', '.join(pc.RELATIVE)}); a trial is {DRAWS} draws and is flagged by a measure "
            "that both cross (the guard's patience 2). Diversity stays per group."
        ),
        "settings": {**s.model_dump(), "draws": DRAWS},
        "per_size": sizes,
        "goal": goal(sizes, results["goal"]),
        "wall_s": wall,
        "cpu_s": cpu,
    }
    return {
        **results,
        "set_level": level,
        "wall_s": results["wall_s"] + wall,
        "cpu_s": results["cpu_s"] + cpu,
    }


# -- its section of table.md -------------------------------------------------------------


def _pct(p: dict) -> str:
    if p["n"] == 0:
        return "–"
    return f"{p['k']}/{p['n']} = {100 * p['rate']:.0f}% [{100 * p['lo']:.0f}, {100 * p['hi']:.0f}]"


def render_section(results: dict) -> list[str]:
    """table.md's set-level section: detection, false alarms, thresholds, per size."""
    level = results["set_level"]
    sizes = list(level["per_size"])
    r0 = level["per_size"][sizes[0]]
    st = level["settings"]
    met = ", ".join(
        f"{size}²: image measures {'met' if g['met_image_measures'] else 'NOT met'}"
        f" (with diversity per group: {'met' if g['met'] else 'NOT met'})"
        for size, g in level["goal"].items()
    )
    lines = [
        "## Set level: the guard's decision shape (added after the per-image results)",
        "",
        f"A trial is a set of the {len(r0['photos']['judging'])} judging photographs standing "
        f"for one evaluation's prompts, drawn {st['draws']} times (two evaluations in a row), "
        "each photograph's image picked from its measured variations above (different images "
        "in the two draws). A measure flags a trial when, at both draws, the paired 95% CI "
        "(common/algorithms/stats.paired_difference, as the guard) of (image − original) over "
        "the set lies "
        "wholly above its threshold (relative to the originals' mean for saturation and "
        "contrast, as `rises_rel`). "
        f"{st['clean_trials']} clean trials per kind and {st['clean_trials']} "
        f"mixed (any kind per photograph); {st['hack_trials']} per hack and strength. "
        f"Thresholds: each the smallest keeping the {len(r0['photos']['choosing'])} choosing "
        f"photographs' clean set trials ≤ {100 * st['fa_target']:g}% flagged. The trials "
        f"resample {r0['pool_images']['clean_per_photo_and_kind']} clean images per photograph "
        f"and kind and {r0['pool_images']['hacked_per_photo']} hacked ones per hack and "
        "strength, so they are not independent: the intervals are narrower than the images "
        "justify. Diversity stays per group (above).",
        "",
        f"Goal at the set level: {met}.",
        "",
        "| hack | strength | " + " | ".join(f"{s}²: tied [95% CI] · any" for s in sizes) + " |",
        "|" + "---|" * (2 + len(sizes)),
    ]
    for hack in ph.HACKS:
        for strength in ("mild", "strong"):
            cells = []
            for size in sizes:
                d = level["per_size"][size]["detection"][hack][strength]
                cells.append(f"{_pct(d['tied'])} · {d['any']['k']}/{d['any']['n']}")
            lines.append(f"| {hack} | {strength} | " + " | ".join(cells) + " |")
    fa = [level["per_size"][s]["false_alarm"] for s in sizes]
    lines += ["", "| clean set trial | " + " | ".join(f"{s}²" for s in sizes) + " |"]
    lines.append("|" + "---|" * (1 + len(sizes)))
    lines.append(
        "| **all (any measure)** | " + " | ".join(f"**{_pct(f['overall'])}**" for f in fa) + " |"
    )
    for kind in (*ph.CLEAN_KINDS, MIXED):
        lines.append(f"| {kind} | " + " | ".join(_pct(f["by_kind"][kind]) for f in fa) + " |")
    lines.append(
        "| (one evaluation only: patience 1) | "
        + " | ".join(_pct(f["one_draw"]) for f in fa)
        + " |"
    )
    lines.append(
        "| (choosing photographs, in sample) | "
        + " | ".join(_pct(f["choosing_in_sample"]) for f in fa)
        + " |"
    )
    lines += ["", "| measure | " + " | ".join(f"{s}²: threshold · clean FA" for s in sizes) + " |"]
    lines.append("|" + "---|" * (1 + len(sizes)))
    for m in r0["thresholds"]:
        kind = "rel." if m in pc.RELATIVE else "abs."
        cells = [
            f"{level['per_size'][s]['thresholds'][m]:.3g} ({kind}) · "
            f"{level['per_size'][s]['false_alarm']['by_measure'][m]:.3g}"
            for s in sizes
        ]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines
