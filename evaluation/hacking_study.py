"""Issue 47's reward-hacking study (docs/results/hacking/issue47/): which image-health and
drift rules flag which runs, at which evaluation, against a person's reading of each run's sample
grids. Rules are chosen on the runs of the choosing seeds and judged on the others.

    python -m g2rpo.evaluation.hacking_study RUNS_DIR LABELS.yaml OUT_DIR

``RUNS_DIR`` holds the runs (a comparison's runs/), ``LABELS.yaml`` the reading:
``{run name: {hack: "what a person sees" or null, seen_at: first iteration it is
visible or null, note: ...}}`` plus ``choose_seeds: [...]``. Writes ``results.json``,
``table.md`` and, per run, ``grids/<run>.png`` (its sample grids over iterations).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from ..common.config.guard import GuardConfig, GuardRule
from ..common.config.guard_defaults import default_rules
from ..common.health.guard import Guard
from ..run_directory.files import read_metrics

PATIENCE = 2
# candidate rules: (signal, test, thresholds tried from the most sensitive)
CANDIDATES = [
    ("health/high_freq", "rises_by", [0.002, 0.005, 0.01, 0.02, 0.05]),
    ("health/periodicity", "rises_by", [0.01, 0.02, 0.03, 0.05, 0.1, 0.2]),
    ("health/background_shift", "rises_by", [0.01, 0.02, 0.03, 0.04, 0.05, 0.07, 0.1]),
    ("health/base_distance", "rises_by", [0.02, 0.03, 0.05, 0.07, 0.1]),
    ("health/saturation", "rises_by", [0.01, 0.02, 0.05]),
    ("health/saturation", "falls_by", [0.01, 0.02, 0.05]),
    ("health/diversity", "falls_by", [0.005, 0.01, 0.02, 0.03, 0.04]),
    ("drift/diverging", "above", [0.5]),
]


def trip_of(rows: list[dict], rules: list[GuardRule], patience: int = PATIENCE) -> int | None:
    """The iteration at which ``action: stop`` with these rules stops the run, or None."""
    cfg = GuardConfig(action="stop", patience=patience, rules=rules)
    return next((r["iteration"] for r in Guard(cfg).replayed(rows) if r["trips"]), None)


def _seed(name: str) -> int:
    return int(name.rsplit("-s", 1)[1])


def choose_rules(runs: dict[str, list[dict]], labels: dict, choose: set[int]) -> list[GuardRule]:
    """Per candidate signal, its most sensitive threshold that trips no run of the choosing
    seeds where no hack was seen, kept when it catches a hacked one of them."""
    chosen = []
    clean = [n for n in runs if _seed(n) in choose and not labels[n]["hack"]]
    hacked = [n for n in runs if _seed(n) in choose and labels[n]["hack"]]
    for signal, test, thresholds in CANDIDATES:
        for t in thresholds:
            rule = GuardRule(signal=signal, **{test: t})
            if any(trip_of(runs[n], [rule]) is not None for n in clean):
                continue
            if any(trip_of(runs[n], [rule]) is not None for n in hacked):
                chosen.append(rule)
            break
    return chosen


def verdict(trip: int | None, label: dict) -> str:
    if label["hack"]:
        return "caught" if trip is not None else "missed"
    return "false alarm" if trip is not None else "left alone"


def study(runs_dir: Path, labels_path: Path) -> dict:
    spec = yaml.safe_load(labels_path.read_text())
    choose = set(spec.pop("choose_seeds"))
    labels = spec
    runs = {n: read_metrics(runs_dir / n) for n in sorted(labels)}
    rules = choose_rules(runs, labels, choose)
    out_runs = {}
    for name, rows in runs.items():
        lab = labels[name]
        trip = trip_of(rows, rules)
        per_rule = {r.describe(): trip_of(rows, [r]) for r in rules}
        defaults = trip_of(rows, default_rules())
        out_runs[name] = {
            "seed_role": "choosing" if _seed(name) in choose else "held out",
            "hack": lab["hack"],
            "seen_at": lab.get("seen_at"),
            "note": lab.get("note", ""),
            "last_iteration": rows[-1]["iteration"] if rows else None,
            "trip": trip,
            "verdict": verdict(trip, lab),
            "lead_iterations": (
                None if trip is None or lab.get("seen_at") is None else lab["seen_at"] - trip
            ),
            "trip_by_rule": per_rule,
            "default_rules_trip": defaults,
            "default_rules_verdict": verdict(defaults, lab),
            "final_changes": _final_changes(rows),
        }
    return {
        "patience": PATIENCE,
        "choose_seeds": sorted(choose),
        "chosen_rules": [r.describe() for r in rules],
        "default_rules": [r.describe() for r in default_rules()],
        "runs": out_runs,
    }


def _final_changes(rows: list[dict]) -> dict:
    """The last evaluation's paired changes (mean, lo, hi) of every health measure and
    held-out drift in the row."""
    last = next((r for r in reversed(rows) if "eval/health/high_freq/delta" in r), {})
    out = {}
    for key, value in last.items():
        if key.endswith("/delta") and (key.startswith(("eval/health/", "eval/shapes"))):
            name = key[len("eval/") : -len("/delta")]
            out[name] = [round(value, 4), round(last[key + "_lo"], 4), round(last[key + "_hi"], 4)]
    return out


def table(results: dict) -> str:
    lines = [
        f"Rules chosen on seeds {results['choose_seeds']} (patience {results['patience']}): "
        + ("; ".join(results["chosen_rules"]) or "none"),
        "",
        "| run | seeds' role | hack seen (first at iteration) | chosen rules stop at | verdict "
        "| default rules stop at | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results["runs"].items():
        seen = f"{r['hack']} ({r['seen_at']})" if r["hack"] else "none"
        lines.append(
            f"| {name} | {r['seed_role']} | {seen} | {_it(r['trip'])} | {r['verdict']} | "
            f"{_it(r['default_rules_trip'])} | {r['default_rules_verdict']} |"
        )
    lines += ["", "Each chosen rule alone (iteration it would stop the run at):", ""]
    rules = results["chosen_rules"]
    lines.append("| run | " + " | ".join(rules) + " |")
    lines.append("|---" * (1 + len(rules)) + "|")
    for name, r in results["runs"].items():
        lines.append(f"| {name} | " + " | ".join(_it(r["trip_by_rule"][x]) for x in rules) + " |")
    return "\n".join(lines) + "\n"


def _it(value) -> str:
    return "—" if value is None else str(value)


def montage(run_dir: Path, path: Path, every: int = 3) -> Path:
    """The run's sample grids over iterations side by side (every ``every``-th and the
    last; the first with its prompt labels, the others only their titles and tiles)."""
    from PIL import Image, ImageDraw

    from ..run_directory.files import iteration_of

    grids = sorted(run_dir.glob("samples/it_*.png"))
    if not grids:
        raise FileNotFoundError(f"{run_dir}: no samples/it_*.png")
    picked = grids[::every] + ([grids[-1]] if grids[-1] not in grids[::every] else [])
    images = [Image.open(p).convert("RGB") for p in picked]
    label_w = _label_width(images[0])
    cropped = []
    for grid, im in zip(picked[1:], images[1:], strict=True):
        im = im.crop((label_w, 0, im.width, im.height))
        draw = ImageDraw.Draw(im)
        draw.rectangle((0, 0, im.width, 11), fill="white")  # over the cut title
        draw.text((6, 0), f"iteration {iteration_of(grid)}", fill="black")
        cropped.append(im)
    images = images[:1] + cropped
    w, h = sum(i.width for i in images), max(i.height for i in images)
    canvas = Image.new("RGB", (w, h), "white")
    x = 0
    for image in images:
        canvas.paste(image, (x, 0))
        x += image.width
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path, optimize=True)
    return path


def _label_width(grid) -> int:
    """Where a sample grid's tiles begin: the first column, past the prompt labels, that
    is not white in the tiles' rows (the grids are ``run_directory.grids``' layout)."""
    import numpy as np

    a = np.asarray(grid)
    rows = a[a.shape[0] // 4 : 3 * a.shape[0] // 4]
    dark = (rows < 200).any(axis=(0, 2))
    # the labels end in a run of white columns; the tiles start after the longest one
    best, start, run_start = 0, 0, None
    for x, d in enumerate(dark):
        if not d and run_start is None:
            run_start = x
        if d and run_start is not None:
            if x - run_start > best:
                best, start = x - run_start, x
            run_start = None
    return max(start - 4, 0)


def main(argv: list[str]) -> int:
    runs_dir, labels, out = (Path(a) for a in argv)
    results = study(runs_dir, labels)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "table.md").write_text(table(results))
    for name in results["runs"]:
        montage(runs_dir / name, out / "grids" / f"{name}.png")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
