"""``g2rpo report DIR``: one self-contained HTML page (images inlined) for a run
directory or a comparison directory."""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path

from ..common.algorithms.stats import paired_difference, per_prompt_means
from ..common.errors import RunDirError
from ..run_directory.files import (
    finished,
    iteration_of,
    read_evaluations,
    read_metrics,
    record_values,
)

TEMPLATE = "report.html.j2"


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _file_uri(path: Path) -> str | None:
    return _data_uri(path.read_bytes()) if path.is_file() else None


def _render(context: dict) -> str:
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    env = Environment(
        loader=PackageLoader("g2rpo.evaluation", "templates"),
        autoescape=select_autoescape(["html", "j2"]),
        undefined=StrictUndefined,
    )
    env.filters["ci"] = _ci
    return env.get_template(TEMPLATE).render(
        generated=dt.datetime.now().strftime("%Y-%m-%d %H:%M"), **context
    )


def _ci(iv: dict | None, signed: bool = False) -> str:
    if not iv:
        return "—"
    f = "{:+.4f}" if signed else "{:.4f}"
    if iv.get("n", 2) < 2 or iv["lo"] == iv["hi"] == iv["mean"]:
        return f.format(iv["mean"])
    return f"{f.format(iv['mean'])} [{f.format(iv['lo'])}, {f.format(iv['hi'])}]"


def _headline(evaluations: list[dict]) -> list[dict]:
    """First and last evaluation of each metric, and the paired change between them."""
    if not evaluations:
        return []
    first, last = evaluations[0], evaluations[-1]
    n = len(first["prompts"])
    before = record_values(first)
    out = []
    for metric, values in record_values(last).items():
        if metric not in before or len(before[metric]) != len(values):
            continue
        a = per_prompt_means(values, n)
        b = per_prompt_means(before[metric], n)
        d = paired_difference(a, b) if last is not first else None
        out.append(
            {
                "metric": metric,
                "first": float(b.mean()),
                "last": float(a.mean()),
                "change": d.as_dict() if d else None,
                "first_it": first["iteration"],
                "last_it": last["iteration"],
            }
        )
    return out


WATCHED = ("high_freq", "periodicity", "background_shift", "diversity", "base_distance")


def hacking_watch(rows: list[dict], config_yaml: str) -> dict:
    """Each evaluation's image-health changes since the first and its reward drift, with
    the rules of the run's ``train.guard`` it crossed (whatever the guard's action) and
    the evaluation at which ``action: stop`` stops, or would have stopped, the run."""
    import yaml

    from ..common.config.guard import GuardConfig
    from ..common.health.guard import Guard

    guard_cfg = GuardConfig(**(yaml.safe_load(config_yaml) or {}).get("train", {}).get("guard", {}))
    readings = {r["iteration"]: r for r in Guard(guard_cfg).replayed(rows)}
    lines = []
    for row in rows:
        if row["iteration"] not in readings:
            continue
        changes = {}
        for m in WATCHED:
            key = f"eval/health/{m}/delta"
            if key in row:
                changes[m] = {"mean": row[key], "lo": row[f"{key}_lo"], "hi": row[f"{key}_hi"]}
        lines.append(
            {
                **readings[row["iteration"]],
                "changes": changes,
                "diverging": row.get("eval/drift/diverging"),
            }
        )
    if not any(r["changes"] for r in lines):
        lines = []  # a run from before the measures: no section rather than empty cells
    trip = next((r["iteration"] for r in lines if r["trips"]), None)
    return {"action": guard_cfg.action, "patience": guard_cfg.patience, "rows": lines,
            "trip": trip, "measures": WATCHED}  # fmt: skip


def run_context(run_dir: Path) -> dict:
    from .report_figures import run_figures

    rows = read_metrics(run_dir)
    if not rows:
        raise RunDirError(f"{run_dir}: metrics.jsonl holds no iterations yet")
    evaluations = read_evaluations(run_dir)
    final_evals = []
    for ev_dir in sorted(run_dir.glob("eval/*/eval.json")):
        summary = json.loads(ev_dir.read_text())
        final_evals.append(
            {
                "name": ev_dir.parent.name,
                "splits": summary["splits"],
                "base": summary.get("base_metrics", {}),
                "grid": _file_uri(ev_dir.parent / "grid.png"),
            }
        )
    return {
        "kind": "run",
        "title": f"run {run_dir.name}",
        "config": (run_dir / "config.yaml").read_text(),
        "finished": finished(run_dir),
        "iterations": len(rows),
        "nfe_train_total": rows[-1].get("nfe_train_total", 0),
        "wall_s": sum(r["time/iteration_s"] for r in rows),
        "last_row": rows[-1],
        "headline": _headline(evaluations),
        "watch": hacking_watch(rows, (run_dir / "config.yaml").read_text()),
        "figures": [(fid, cap, _data_uri(png)) for fid, cap, png in run_figures(rows, evaluations)],
        "samples": [
            (iteration_of(p), _data_uri(p.read_bytes()))
            for p in sorted(run_dir.glob("samples/it_*.png"))
        ],
        "final_evals": final_evals,
    }


def compare_context(root: Path) -> dict:
    results = json.loads((root / "results.json").read_text())
    from .compare_results import VIEWS

    return {
        "kind": "compare",
        "title": f"comparison {results['spec']['name']}",
        "results": results,
        "views": VIEWS,
        "splits": list(results["base"]),
        "table_md": (root / "table.md").read_text() if (root / "table.md").is_file() else "",
        "figures": [
            (f"fig-{name}", caption, uri)
            for name, caption in (
                ("reward_vs_nfe", "Held-out reward vs training NFEs (equal compute)"),
                ("reward_vs_wall", "Held-out reward vs wall time"),
            )
            if (uri := _file_uri(root / f"{name}.png"))
        ],
        "grid": _file_uri(root / "grid.png"),
    }


def write_report(directory: str | Path, out: str | Path | None = None) -> Path:
    """Render the report of a run or comparison directory; returns the HTML path."""
    d = Path(directory)
    if (d / "results.json").is_file():
        context = compare_context(d)
    elif (d / "metrics.jsonl").is_file():
        context = run_context(d)
    else:
        raise RunDirError(
            f"{d}: neither a run directory (metrics.jsonl) nor a comparison (results.json)"
        )
    path = Path(out) if out else d / "report.html"
    path.write_text(_render(context), encoding="utf-8")
    return path
