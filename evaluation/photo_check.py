"""``g2rpo hacking photos``: the image-health measures (common/health/image_health.py) on natural
photographs given known hacks, against clean variations of the same photographs.

The decision rule (evaluation/photo_rule.py) has the training guard's shape: a measure's
change from the base (the original photograph; for diversity, the prompt's first group)
in the measure's own direction, against a threshold. Changes are relative to the base for levels
(``RELATIVE``), plain differences for shares, logs and distances. Each threshold is the
smallest that keeps the CHOOSING photographs' clean variations' false-alarm rate at or
below ``fa_target``; detection and false alarms are judged on the other photographs
(JUDGING) with variations drawn from other seeds. Whatever ``per_image`` returns is
measured, so measures added to image_health are picked up without a change here."""

from __future__ import annotations

import time

import numpy as np
from g2rpo.common.health import image_health
from g2rpo.evaluation import photo_hacks as ph
from g2rpo.evaluation.photo_rule import (
    FALLS,
    RELATIVE,
    TIED,
    calibrate,
    proportion,
    signed_change,
    tied_measures,
)
from pydantic import BaseModel, Field, model_validator

CHOOSING = ("astronaut", "coffee", "immunohistochemistry", "retina", "camera", "grass")
JUDGING = ("chelsea", "rocket", "hubble_deep_field", "stereo_motorcycle", "brick", "gravel", "moon")
QUICK_CHOOSING = ("astronaut", "coffee", "camera", "grass")
QUICK_JUDGING = ("chelsea", "rocket", "brick", "moon")

PAIR_MEASURES = ("base_distance", "background_shift")  # thumbnail distances from the base
STREAMS = {"choosing": 1, "judging": 2, "hack": 3, "groups": 4, "wide": 5}
BATCH = 16  # images measured at a time: 16 float copies of 1024² stay under 1 GiB


class PhotoCheckSettings(BaseModel):
    """The sizes of one check; ``quick`` is the test-sized one."""

    sizes: list[int] = Field(default_factory=lambda: [512, 720, 1024])
    seed: int = 0
    fa_target: float = Field(0.02, description="clean false-alarm rate each threshold keeps")
    choosing: list[str] = Field(default_factory=lambda: list(CHOOSING))
    judging: list[str] = Field(default_factory=lambda: list(JUDGING))
    clean_per_kind: int = Field(6, description="clean variations of each kind per photograph")
    hack_seeds: int = Field(4, description="hacked images per hack, strength and photograph")
    wide_crops: int = Field(8, description="50-70% crops per photograph for the crop groups")
    group_pairs: int = Field(100, description="clean group pairs per group kind and set")
    collapse_groups: int = Field(8, description="collapsed groups per photograph and strength")
    group_size: int = 4

    @model_validator(mode="after")
    def _groups_fit(self):
        if self.wide_crops < 2 * self.group_size:
            raise ValueError(
                f"wide_crops {self.wide_crops}: needs two groups' worth (≥ {2 * self.group_size})"
            )
        if len(ph.PHOTOMETRIC_KINDS) * self.clean_per_kind < self.group_size:
            raise ValueError(
                f"clean_per_kind {self.clean_per_kind}: too few for a strong collapse group"
            )
        if min(len(self.choosing), len(self.judging)) < self.group_size:
            raise ValueError(f"choosing and judging each need ≥ {self.group_size} photographs")
        return self

    @classmethod
    def quick(cls, sizes: list[int] | None = None, seed: int = 0) -> PhotoCheckSettings:
        return cls(
            sizes=sizes or [256],
            seed=seed,
            choosing=list(QUICK_CHOOSING),
            judging=list(QUICK_JUDGING),
            clean_per_kind=2,
            hack_seeds=1,
            wide_crops=8,
            group_pairs=10,
            collapse_groups=2,
        )


# -- measuring ---------------------------------------------------------------------------


def _rng(seed: int, stream: str, *ids: int) -> np.random.Generator:
    return np.random.default_rng([seed, STREAMS[stream], *ids])


def measure(images: np.ndarray, cost: dict) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """per_image's measures and the thumbnails of ``images``, timing both into ``cost``."""
    parts, thumbs = [], []
    for lo in range(0, len(images), BATCH):
        x = images[lo : lo + BATCH]
        t0 = time.perf_counter()
        parts.append(image_health.per_image(x))
        t1 = time.perf_counter()
        thumbs.append(image_health.thumbnails(x))
        cost["per_image_s"] += t1 - t0
        cost["thumbnails_s"] += time.perf_counter() - t1
        cost["images"] += len(x)
    names = list(parts[0])
    return {m: np.concatenate([p[m] for p in parts]) for m in names}, np.concatenate(thumbs)


def photo_images(
    base: np.ndarray, photo: str, index: int, role: str, size: int, s: PhotoCheckSettings
) -> tuple[list[dict], list[np.ndarray]]:
    """The base, its clean variations and (judging photographs) its hacked images, with a
    label for each. A hacked image is a hack on a fresh clean variation: the natural
    difference from the base is there as in a run's later samples."""
    labels, images = [{"kind": "base", "variation": "base", "strength": ""}], [base]
    for ki, kind in enumerate(ph.CLEAN_KINDS):
        for i in range(s.clean_per_kind):
            rng = _rng(s.seed, role, size, index, ki, i)
            images.append(ph.clean_variation(base, kind, rng))
            labels.append({"kind": "clean", "variation": kind, "strength": ""})
    if role == "judging":
        for hi, hack in enumerate(ph.HACKS):
            if not ph.applicable(hack, photo):
                continue
            for si, strength in enumerate(("mild", "strong")):
                for i in range(s.hack_seeds):
                    rng = _rng(s.seed, "hack", size, index, hi, si, i)
                    x = ph.clean_variation(base, str(rng.choice(ph.CLEAN_KINDS)), rng)
                    images.append(ph.apply_hack(x, hack, strength, rng))
                    labels.append({"kind": "hack", "variation": hack, "strength": strength})
    return labels, images


def measure_size(size: int, s: PhotoCheckSettings, photos: dict, bar=None) -> dict:
    """Every photograph's rows at one size: labels, measures, the signed changes from its
    base, and the thumbnails the groups draw from."""
    cost = {"per_image_s": 0.0, "thumbnails_s": 0.0, "images": 0}
    rows, thumbs = [], {}
    for role, names in (("choosing", s.choosing), ("judging", s.judging)):
        for index, photo in enumerate(names):
            base = ph.square(photos[photo], size)
            labels, images = photo_images(base, photo, index, role, size, s)
            values, t = measure(np.stack(images), cost)
            pair = {
                "base_distance": image_health.base_distance(t, t[:1]),
                "background_shift": image_health.background_shift(t, t[:1]),
            }
            wide = [
                ph.wide_crop(base, _rng(s.seed, "wide", size, index, i))
                for i in range(s.wide_crops)
            ]
            thumbs[photo] = {
                "base": t[0],
                "clean": {
                    k: t[[i for i, lab in enumerate(labels) if lab["variation"] == k]]
                    for k in ph.CLEAN_KINDS
                },
                "wide": image_health.thumbnails(np.stack(wide)),
            }
            for i, lab in enumerate(labels):
                row = {"photo": photo, "set": role, **lab}
                row.update({m: float(v[i]) for m, v in values.items()})
                row.update({m: float(v[i]) for m, v in pair.items()})
                row["change"] = {
                    m: float(signed_change(m, v[i], v[0])) for m, v in {**values, **pair}.items()
                }
                rows.append(row)
            if bar is not None:
                bar.update(1)
    return {"rows": rows, "thumbs": thumbs, "cost": cost}


# -- judging -----------------------------------------------------------------------------


def _changes(rows: list[dict], measures: list[str]) -> np.ndarray:
    return np.array([[r["change"][m] for m in measures] for r in rows], float).reshape(
        -1, len(measures)
    )


def judge_images(rows: list[dict], s: PhotoCheckSettings) -> dict:
    """Thresholds from the choosing photographs' clean variations; false alarms and
    detection on the judging photographs'."""
    measures = [m for m in rows[0]["change"]]
    choosing = [r for r in rows if r["set"] == "choosing" and r["kind"] == "clean"]
    c = _changes(choosing, measures)
    thresholds = {m: calibrate(c[:, j], s.fa_target) for j, m in enumerate(measures)}
    t = np.array([thresholds[m] for m in measures])

    def flags(subset: list[dict]) -> np.ndarray:
        return _changes(subset, measures) > t[None, :]

    def by_measure(f: np.ndarray) -> dict:
        return {m: float(f[:, j].mean()) if len(f) else None for j, m in enumerate(measures)}

    clean = [r for r in rows if r["set"] == "judging" and r["kind"] == "clean"]
    f_clean = flags(clean)
    false_alarm = {
        "overall": proportion(int(f_clean.any(axis=1).sum()), len(clean)),
        "by_kind": {},
        "by_measure": by_measure(f_clean),
        "choosing_in_sample": proportion(int((c > t[None, :]).any(axis=1).sum()), len(c)),
    }
    for kind in ph.CLEAN_KINDS:
        idx = [i for i, r in enumerate(clean) if r["variation"] == kind]
        false_alarm["by_kind"][kind] = proportion(int(f_clean[idx].any(axis=1).sum()), len(idx))
    detection = {}
    for hack in ph.HACKS:
        tied = tied_measures(hack, measures)
        cols = [measures.index(m) for m in tied]
        detection[hack] = {"tied_measures": tied}
        for strength in ("mild", "strong"):
            sub = [r for r in rows if r["variation"] == hack and r["strength"] == strength]
            f = flags(sub)
            detection[hack][strength] = {
                "tied": proportion(int(f[:, cols].any(axis=1).sum()) if cols else 0, len(sub)),
                "any": proportion(int(f.any(axis=1).sum()), len(sub)),
                "by_measure": by_measure(f),
            }
    return {"thresholds": thresholds, "false_alarm": false_alarm, "detection": detection}


def _diversity(members: list[np.ndarray]) -> float:
    return float(image_health.diversity(np.stack(members), len(members))[0])


def group_pairs(
    thumbs: dict, names: list[str], rng: np.random.Generator, s: PhotoCheckSettings, collapse: bool
) -> dict:
    """Signed diversity changes of clean group pairs (``photos``: a prompt whose samples are
    different photographs, base and later drawn apart; ``crops``: 50-70% crops of one
    photograph) and, with ``collapse``, of collapsed groups against such a base: ``mild``,
    jittered copies of one photograph (any clean variation); ``strong``, copies with only
    colour, exposure or JPEG changes."""
    g = s.group_size
    out = {"photos": [], "crops": []}
    pick = lambda seq, k: [seq[i] for i in rng.choice(len(seq), k, replace=False)]  # noqa: E731

    def change(base: list, after: list) -> float:
        return float(signed_change("diversity", _diversity(after), _diversity(base)))

    def jittered(photo: str, kinds: tuple) -> list:
        pool = [t for k in kinds for t in thumbs[photo]["clean"][k]]
        return pick(pool, g)

    for _ in range(s.group_pairs):
        base = [thumbs[p]["base"] for p in pick(names, g)]
        after = [
            pick(list(thumbs[p]["clean"][str(rng.choice(ph.CLEAN_KINDS))]), 1)[0]
            for p in pick(names, g)
        ]
        out["photos"].append(change(base, after))
        wide = thumbs[str(rng.choice(names))]["wide"]
        order = rng.permutation(len(wide))
        out["crops"].append(change(list(wide[order[:g]]), list(wide[order[g : 2 * g]])))
    if collapse:
        for strength, kinds in (("mild", ph.CLEAN_KINDS), ("strong", ph.PHOTOMETRIC_KINDS)):
            out[f"photos/{strength}"], out[f"crops/{strength}"] = [], []
            for photo in names:
                others = [p for p in names if p != photo]
                for _ in range(s.collapse_groups):
                    base = [thumbs[p]["base"] for p in [photo, *pick(others, g - 1)]]
                    out[f"photos/{strength}"].append(change(base, jittered(photo, kinds)))
                    wide = list(thumbs[photo]["wide"])
                    out[f"crops/{strength}"].append(change(pick(wide, g), jittered(photo, kinds)))
    return out


def judge_groups(thumbs: dict, size: int, s: PhotoCheckSettings) -> dict:
    """The diversity rule: threshold on the choosing photographs' clean group pairs (both
    kinds pooled), judged on the judging photographs' pairs and collapsed groups."""
    choosing = group_pairs(thumbs, s.choosing, _rng(s.seed, "groups", size, 0), s, collapse=False)
    judging = group_pairs(thumbs, s.judging, _rng(s.seed, "groups", size, 1), s, collapse=True)
    threshold = calibrate(np.array(choosing["photos"] + choosing["crops"]), s.fa_target)

    def rate(changes: list) -> dict:
        return proportion(int((np.array(changes) > threshold).sum()), len(changes))

    return {
        "threshold": threshold,
        "false_alarm": {kind: rate(judging[kind]) for kind in ("photos", "crops")},
        "detection": {
            strength: {kind: rate(judging[f"{kind}/{strength}"]) for kind in ("photos", "crops")}
            for strength in ("mild", "strong")
        },
        "changes": {k: [round(v, 6) for v in vals] for k, vals in judging.items()},
    }


# -- the whole check ---------------------------------------------------------------------


def columns(rows: list[dict]) -> dict:
    """The rows as columns (every measured value, for a reader to recompute from)."""
    keys = [k for k in rows[0] if k != "change"]
    return {k: [r[k] if isinstance(r[k], str) else round(r[k], 7) for r in rows] for k in keys}


def run_check(s: PhotoCheckSettings, progress: bool = True) -> dict:
    from tqdm import tqdm

    t0, cpu0 = time.perf_counter(), time.process_time()
    photos = {name: ph.load_photo(name) for name in [*s.choosing, *s.judging]}
    per_size = {}
    total = len(s.sizes) * (len(s.choosing) + len(s.judging))
    with tqdm(total=total, desc="photos × sizes", disable=not progress) as bar:
        for size in s.sizes:
            measured = measure_size(size, s, photos, bar)
            cost = measured["cost"]
            per_size[str(size)] = {
                **judge_images(measured["rows"], s),
                "groups": judge_groups(measured["thumbs"], size, s),
                "cost": {
                    "per_image_ms": 1e3 * cost["per_image_s"] / cost["images"],
                    "thumbnails_ms": 1e3 * cost["thumbnails_s"] / cost["images"],
                    "images": cost["images"],
                },
                "rows": columns(measured["rows"]),
            }
    measures = list(next(iter(per_size.values()))["thresholds"])
    return {
        "settings": s.model_dump(),
        "photos": {"choosing": s.choosing, "judging": s.judging, "source": "skimage.data"},
        "hacks": ph.HACKS,
        "clean_kinds": list(ph.CLEAN_KINDS),
        "measures": {
            "names": measures,
            "relative": [m for m in measures if m in RELATIVE] + list(FALLS),
            "falls": list(FALLS),
            "tied": {h: list(g) for h, g in TIED.items()},
            "tied_present": {h: tied_measures(h, [*measures, *FALLS]) for h in TIED},
        },
        "ci": "95% Clopper–Pearson (scipy.stats.binomtest(...).proportion_ci(method='exact'))",
        "per_size": per_size,
        "goal": goal(per_size),
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - cpu0,  # the machine may be shared: wall_s is not the cost
    }


def goal(per_size: dict) -> dict:
    """The issue's goal on photographs: every hack found at its strong strength (by a measure
    tied to it, every hacked image) with at most 5% false alarms on clean variations."""
    out = {}
    for size, r in per_size.items():
        strong = {h: r["detection"][h]["strong"]["tied"]["rate"] for h in ph.HACKS}
        strong["collapse"] = min(v["rate"] for v in r["groups"]["detection"]["strong"].values())
        fa = r["false_alarm"]["overall"]["rate"]
        fa_groups = max(v["rate"] for v in r["groups"]["false_alarm"].values())
        out[size] = {
            "strong_tied_detection": strong,
            "false_alarm": fa,
            "false_alarm_groups": fa_groups,
            "met": all(v == 1.0 for v in strong.values()) and max(fa, fa_groups) <= 0.05,
        }
    return out
