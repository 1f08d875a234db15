"""A comparison's training-time evaluations read at fixed training-NFE marks
(``budget.curve_at_nfe``): each run's held-out change since its own iteration-0
evaluation (the base model on the same prompts and noise), read linearly between the
evaluations either side of the mark; per method the mean over seeds with a t-CI; the
reference minus each method, paired per seed. It reads an earlier budget inside a
longer run (the 1× point of a 3× run) with no checkpoint kept there."""

from __future__ import annotations

import numpy as np

from ..common.stats import across_seeds, seeds_to_resolve


def change_at_nfe(
    evaluations: list[dict], metric: str, nfe: int, budget: int | None = None
) -> float | None:
    """The metric's mean at ``nfe`` training NFEs minus its mean at iteration 0,
    linear between the two evaluations around ``nfe``. A mark at or past ``budget``
    (the comparison's) is read at the run's last evaluation: a run stops before the
    iteration that would pass its budget, so it ends a little short of it. None when
    the run has no iteration-0 evaluation or did not reach ``nfe``."""
    points = [
        (e["nfe_train_total"], float(np.mean(e["scores"][metric])))
        for e in evaluations
        if metric in e["scores"]
    ]
    if len(points) < 2 or points[0][0] != 0:
        return None
    if budget is not None and nfe >= budget:
        nfe = points[-1][0]
    if nfe > points[-1][0]:
        return None
    x, y = zip(*points, strict=True)
    return float(np.interp(nfe, x, y)) - y[0]


def curves_at_nfe(
    evaluations: dict[tuple[str, int], list[dict]],
    methods: list[str],
    reference: str,
    metrics: list[str],
    marks: list[int],
    budget: int | None = None,
) -> dict:
    """``evaluations``: each run's training-time evaluations by (method, seed).
    Returns {"runs": {method: {seed: {metric: {mark: change}}}}, "methods": {method:
    {metric: {mark: interval}}}, "vs_reference": {method: {metric: {mark: interval}}}}
    (marks as strings, JSON's keys). ``budget``: the comparison's NFE budget."""
    runs: dict = {}
    for (method, seed), evs in evaluations.items():
        runs.setdefault(method, {})[seed] = {
            m: {str(k): change_at_nfe(evs, m, k, budget) for k in marks} for m in metrics
        }
    out: dict = {"marks": list(marks), "runs": runs, "methods": {}, "vs_reference": {}}
    for method in (m for m in methods if m in runs):
        seeds = runs[method]
        out["methods"][method] = {
            m: {str(k): _interval([seeds[s][m][str(k)] for s in sorted(seeds)]) for k in marks}
            for m in metrics
        }
        if method == reference or reference not in runs:
            continue
        ref = runs[reference]
        both = sorted(set(seeds) & set(ref))
        out["vs_reference"][method] = {
            m: {
                str(k): _interval(
                    [
                        ref[s][m][str(k)] - seeds[s][m][str(k)]
                        for s in both
                        if ref[s][m][str(k)] is not None and seeds[s][m][str(k)] is not None
                    ],
                    paired=True,
                )
                for k in marks
            }
            for m in metrics
        }
    return out


def _interval(values: list[float | None], paired: bool = False) -> dict | None:
    have = [v for v in values if v is not None]
    if not have:
        return None
    iv = across_seeds(have).as_dict()
    if paired and len(have) >= 2:
        iv["seeds_to_resolve"] = seeds_to_resolve(have)
    return iv


def curves_table(curves: dict, labels: dict[str, str], reference: str) -> list[str]:
    """Markdown lines: per method and mark, the change since iteration 0; then the
    reference minus each method."""
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
        cells = [_fmt(per[m][str(k)]) for m in metrics for k in marks]
        seeds = len(curves["runs"][method])
        out.append(f"| {labels[method]} | {seeds} | " + " | ".join(cells) + " |")
    for method, per in curves["vs_reference"].items():
        cells = [_fmt(per[m][str(k)]) for m in metrics for k in marks]
        out.append(f"| {labels[reference]} − {labels[method]} | | " + " | ".join(cells) + " |")
    out.append("")
    return out


def _fmt(iv: dict | None) -> str:
    if not iv:
        return "—"
    cell = f"{iv['mean']:+.4f} [{iv['lo']:+.4f}, {iv['hi']:+.4f}]"
    if iv.get("seeds_to_resolve") and iv["lo"] <= 0 <= iv["hi"]:
        cell += f" ({iv['seeds_to_resolve']} seeds)"
    return cell
