"""A comparison's results: per run and per method (mean over seeds with a 95%
Student-t CI), the paired difference of each method against the base and against
the reference method, as results.json and table.md."""

from __future__ import annotations

import json

from ..common.algorithms.stats import seed_summary
from ..run_directory.files import finished, read_evaluations, read_metrics
from .compare_curves import curves_at_nfe
from .compare_spec import CompareSpec, PlannedRun

VIEWS = {"budget": "at the budget", "at_iterations": "at equal iterations"}


def headline_metrics(spec_runs: list[PlannedRun], evaluations: dict) -> list[str]:
    """The training reward first, then the checker's strict pass rate and shapes_clip
    (when scored, and not the training reward itself: shapes_strict is the pass rate)."""
    splits = next(iter(evaluations["runs"].values()))["splits"]
    metrics = (splits.get("held_out") or next(iter(splits.values())))["metrics"]
    main = spec_runs[0].config.rewards[0].name
    # shapes_strict is the checker's pass: listed once, as the training reward
    same = {"shapes_strict": "shapes_oracle/pass"}.get(main) if main in metrics else None
    out = [m for m in (main, "shapes_oracle/pass", "shapes_clip") if m in metrics and m != same]
    out = list(dict.fromkeys(out))
    return out or sorted(metrics)[:2]


def _run_entry(run: PlannedRun, evaluations: dict) -> dict:
    from ..common.health.guard import Guard

    rows = read_metrics(run.run_dir)
    guard = run.config.train.guard
    readings = Guard(guard).replayed(rows)
    views = {
        key.split("/", 1)[1]: value["splits"]
        for key, value in evaluations["runs"].items()
        if key.split("/", 1)[0] == run.name
    }
    return {
        "method": run.method,
        "seed": run.seed,
        "name": run.name,
        "run_dir": str(run.run_dir),
        "finished": finished(run.run_dir),
        "iterations": len(rows),
        "nfe_train_total": rows[-1]["nfe_train_total"] if rows else 0,
        "wall_s": float(sum(r["time/iteration_s"] for r in rows)),
        "views": views,
        # where train.guard's rules stop (action stop) or would stop the run
        "guard": {
            "action": guard.action,
            "trip": next((r["iteration"] for r in readings if r["trips"]), None),
            "crossed_at": [r["iteration"] for r in readings if r["crossed"]],
        },
    }


def _aggregate(entries: list[dict], view: str, split: str, metric: str) -> dict:
    have = [e for e in entries if view in e["views"] and split in e["views"][view]]
    levels = [e["views"][view][split]["metrics"][metric]["mean"] for e in have]
    deltas = [e["views"][view][split]["vs_base"][metric]["mean"] for e in have]
    return {"runs": len(have), "mean": seed_summary(levels), "vs_base": seed_summary(deltas)}


def _aggregate_health(entries: list[dict], view: str, split: str, measure: str) -> dict:
    have = [
        e["views"][view][split]["health"]
        for e in entries
        if view in e["views"] and "health" in e["views"][view].get(split, {})
    ]
    levels = [h["metrics"][measure]["mean"] for h in have]
    deltas = [h["vs_base"][measure]["mean"] for h in have]
    return {"runs": len(have), "mean": seed_summary(levels), "vs_base": seed_summary(deltas)}


def build_results(spec: CompareSpec, runs: list[PlannedRun], evaluations: dict) -> dict:
    entries = [_run_entry(r, evaluations) for r in runs]
    headline = headline_metrics(runs, evaluations)
    views = sorted({v for e in entries for v in e["views"]}, key=list(VIEWS).index)
    splits = list(evaluations["base"]["splits"])
    all_metrics = list(evaluations["base"]["splits"][splits[0]]["metrics"])
    health = list(evaluations["base"]["splits"][splits[0]].get("health", {}).get("metrics", {}))
    methods = {}
    for method in spec.methods:
        mine = [e for e in entries if e["method"] == method]
        if not mine:  # none of its runs finished yet
            continue
        methods[method] = {
            "label": spec.label(method),
            "seeds": [e["seed"] for e in mine],
            "iterations": seed_summary([e["iterations"] for e in mine]),
            "nfe_train_total": seed_summary([e["nfe_train_total"] for e in mine]),
            "wall_s": seed_summary([e["wall_s"] for e in mine]),
            "views": {
                view: {
                    split: {m: _aggregate(mine, view, split, m) for m in all_metrics}
                    for split in splits
                }
                for view in views
            },
            "health": {
                view: {
                    split: {h: _aggregate_health(mine, view, split, h) for h in health}
                    for split in splits
                }
                for view in views
            },
        }
    curves = None
    if spec.budget.curve_at_nfe:
        curves = curves_at_nfe(
            {(r.method, r.seed): read_evaluations(r.run_dir) for r in runs},
            list(spec.methods),
            spec.reference_method(),
            headline,
            spec.budget.curve_at_nfe,
            spec.budget.nfe,
        )
    return {
        "spec": spec.record(),
        "headline_metrics": headline,
        "curve_at_nfe": curves,
        "views": views,
        "base": {s: v["metrics"] for s, v in evaluations["base"]["splits"].items()},
        "methods": methods,
        "vs_reference": _versus_reference(spec, entries, views, splits, all_metrics),
        "runs": entries,
    }


def _versus_reference(spec, entries, views, splits, metrics) -> dict:
    """reference − method, per seed (same seed, same eval noise), t-CI over seeds."""
    ref = spec.reference_method()
    out: dict = {}
    by = {(e["method"], e["seed"]): e for e in entries}
    if not any(e["method"] == ref for e in entries):
        return out
    for method in spec.methods:
        if method == ref or not any(e["method"] == method for e in entries):
            continue
        out[method] = {}
        for view in views:
            out[method][view] = {}
            for split in splits:
                out[method][view][split] = {}
                for m in metrics:
                    diffs = []
                    for seed in spec.seeds:
                        a, b = by.get((ref, seed)), by.get((method, seed))
                        if a and b and view in a["views"] and view in b["views"]:
                            diffs.append(
                                a["views"][view][split]["metrics"][m]["mean"]
                                - b["views"][view][split]["metrics"][m]["mean"]
                            )
                    # with how many seeds its mean and seed variance would need (the
                    # table shows it where the CI holds zero)
                    out[method][view][split][m] = seed_summary(diffs, paired=True)
    return out


def _cell(iv: dict | None, signed: bool = False, digits: int = 4) -> str:
    if not iv:
        return "—"
    f = f"{{:+.{digits}f}}" if signed else f"{{:.{digits}f}}"
    if iv["n"] < 2:
        return f.format(iv["mean"])
    return f"{f.format(iv['mean'])} [{f.format(iv['lo'])}, {f.format(iv['hi'])}]"


def _versus_cell(iv: dict | None) -> str:
    cell = _cell(iv, signed=True)
    if iv and iv["n"] >= 2 and iv["lo"] <= 0 <= iv["hi"]:
        need = iv.get("seeds_to_resolve")
        if need:
            cell += f" ({need} seeds)"
        else:  # seeds_to_resolve: None for a zero mean (never), or past its 10,000
            cell += " (no number of seeds)" if iv["mean"] == 0 else " (over 10,000 seeds)"
    return cell


def curves_table(curves: dict, labels: dict[str, str], reference: str) -> list[str]:
    """Markdown lines for ``curve_at_nfe``: per method and mark, the change since
    iteration 0; then the reference minus each method."""
    marks = curves["marks"]
    metrics = list(next(iter(curves["methods"].values()))) if curves["methods"] else []
    cols = [f"{m} at {k:,} NFEs" for m in metrics for k in marks]
    out = [
        "### training-time held-out evaluations at fixed NFEs (change since each run's "
        "iteration 0, linear between evaluations, at the budget its last one; mean over "
        "seeds, 95% t-CI)\n",
        "| method | seeds | " + " | ".join(cols) + " |",
        "|---" * (2 + len(cols)) + "|",
    ]
    for method, per in curves["methods"].items():
        cells = [_cell(per[m][str(k)], signed=True) for m in metrics for k in marks]
        seeds = len(curves["runs"][method])
        out.append(f"| {labels[method]} | {seeds} | " + " | ".join(cells) + " |")
    for method, per in curves["vs_reference"].items():
        cells = [_versus_cell(per[m][str(k)]) for m in metrics for k in marks]
        out.append(f"| {labels[reference]} − {labels[method]} | | " + " | ".join(cells) + " |")
    out.append("")
    return out


def results_table(results: dict) -> str:
    """Markdown: per view, one row per method; then reference − method; then runs."""
    head = results["headline_metrics"]
    splits = list(results["base"])
    out = []
    base_cells = " | ".join(
        f"{s} {m}: {results['base'][s][m]['mean']:.4f}" for s in splits for m in head
    )
    out.append(f"Base model (same prompts and noise): {base_cells}\n")
    for view in results["views"]:
        out.append(f"### {VIEWS[view]}\n")
        cols = [f"{s} {m}" for s in splits for m in head]
        out.append(
            "| method | seeds | iterations | training NFEs | "
            + " | ".join(f"{c} | Δ vs base" for c in cols)
            + " |"
        )
        out.append("|---" * (4 + 2 * len(cols)) + "|")
        for r in results["methods"].values():
            if view not in r["views"]:
                continue
            cells = []
            for s in splits:
                for m in head:
                    agg = r["views"][view][s][m]
                    cells += [_cell(agg["mean"]), _cell(agg["vs_base"], signed=True)]
            its = (
                r["iterations"]["mean"]
                if view == "budget"
                else results["spec"]["budget"].get("also_at_iterations")
            )
            nfe = r["nfe_train_total"]["mean"] if view == "budget" else None
            out.append(
                f"| {r['label']} | {len(r['seeds'])} | {its:.0f} | "
                + (f"{nfe:,.0f}" if nfe else "—")
                + " | "
                + " | ".join(cells)
                + " |"
            )
        out.append("")
    ref = results["spec"].get("reference") or next(iter(results["methods"]))
    if results["vs_reference"]:
        label = results["methods"][ref]["label"]
        out.append(
            f"### {label} − method (same seed, same eval noise; 95% t-CI over seeds; where the "
            "CI holds zero, the seeds its mean and seed variance would need in brackets)\n"
        )
        cols = [f"{s} {m}" for s in splits for m in head]
        out.append("| method | view | " + " | ".join(cols) + " |")
        out.append("|---" * (2 + len(cols)) + "|")
        for method, views in results["vs_reference"].items():
            for view, per_split in views.items():
                cells = [_versus_cell(per_split[s][m]) for s in splits for m in head]
                out.append(
                    f"| {results['methods'][method]['label']} | {VIEWS[view]} | "
                    + " | ".join(cells)
                    + " |"
                )
        out.append("")
    out += health_table(results)
    if results.get("curve_at_nfe"):
        labels = {m: r["label"] for m, r in results["methods"].items()}
        out += curves_table(results["curve_at_nfe"], labels, ref)
    out.append("### Runs (Δ vs base: paired over prompts, 95% bootstrap CI)\n")
    cols = [f"{s} {m}" for s in splits for m in head]
    out.append(
        "| run | iterations | training NFEs | wall s | " + " | ".join(cols) + " | train.guard |"
    )
    out.append("|---" * (5 + len(cols)) + "|")
    for e in results["runs"]:
        v = e["views"].get("budget", {})
        cells = [
            _cell(v.get(s, {}).get("vs_base", {}).get(m), signed=True) for s in splits for m in head
        ]
        out.append(
            f"| {e['name']} | {e['iterations']} | {e['nfe_train_total']:,} | "
            f"{e['wall_s']:.0f} | " + " | ".join(cells) + f" | {_guard_cell(e.get('guard'))} |"
        )
    return "\n".join(out) + "\n"


def _guard_cell(guard: dict | None) -> str:
    if not guard or guard["trip"] is None:
        return "—"
    verb = "stopped" if guard["action"] == "stop" else "would stop"
    return f"{verb} at iteration {guard['trip']}"


def health_table(results: dict) -> list[str]:
    """Markdown lines: each method's image-health change against the base (final
    evaluation, mean over seeds, 95% t-CI), beside the rewards of the tables above."""
    first = next(iter(results["methods"].values()), None)
    if first is None or not first.get("health", {}).get("budget"):
        return []
    split = (
        "held_out"
        if "held_out" in first["health"]["budget"]
        else next(iter(first["health"]["budget"]))
    )
    measures = list(first["health"]["budget"][split])
    out = [
        f"### image health, {split} (Δ vs base on the same noise; mean over seeds, 95% t-CI)\n",
        "| method | " + " | ".join(measures) + " |",
        "|---" * (1 + len(measures)) + "|",
    ]
    for r in results["methods"].values():
        cells = [_cell(r["health"]["budget"][split][m]["vs_base"], signed=True) for m in measures]
        out.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    out.append("")
    return out


def write_results(spec: CompareSpec, runs: list[PlannedRun], evaluations: dict) -> dict:
    from .compare_plots import draw_curves, draw_side_by_side

    results = build_results(spec, runs, evaluations)
    root = spec.root
    (root / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (root / "table.md").write_text(results_table(results))
    draw_curves(spec, runs, results["headline_metrics"], root)
    draw_side_by_side(spec, runs, root)
    return results
