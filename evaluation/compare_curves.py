"""A comparison's training-time evaluations read at fixed training-NFE marks
(``budget.curve_at_nfe``): each run's held-out change since its own iteration-0
evaluation (the base model on the same prompts and noise), read linearly between the
evaluations either side of the mark; per method the mean over seeds with a t-CI; the
reference minus each method, paired per seed. It reads an earlier budget inside a
longer run (the 1× point of a 3× run) with no checkpoint kept there."""

from __future__ import annotations

import numpy as np

from ..common.algorithms.stats import seed_summary


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
    """Over the seeds that reached the mark."""
    return seed_summary([v for v in values if v is not None], paired=paired)
