"""When in training each method gains and each shuffled-advantage control falls: the
held-out change of the training-time evaluations (every 12,560 training NFEs, each
against the run's own iteration-0 evaluation on the same prompts and noise) read at a
quarter, half, three quarters and all of the budget (``budget.curve_at_nfe``), and the
share of the final change reached by each mark: mean change at the mark over mean change
at the budget, with a 95% bootstrap CI over seeds (scipy's percentile bootstrap, a
seed's change at the mark and at the budget resampled together). A change that builds up
evenly per update reaches 25%, 50%, 75%; a larger early share means it comes early and
then levels off. No share is given where the change at the
budget is not resolved (its t-CI over seeds holds zero): a ratio to about nothing.

A diagnostic beside the reward tables (docs/results.md, "Why the controls fall"), read
from the results.json of

    bin/g2rpo compare <methods.yaml holding the methods and their controls> --eval-only \\
        --set "budget.curve_at_nfe=[25120,50240,75360,100480]"

    .venv/bin/python docs/results/methods_newer_controls/fall_timecourse.py RESULTS_JSON
"""

import json
import sys
from pathlib import Path

import numpy as np
from g2rpo.common.algorithms.stats import across_seeds
from scipy.stats import bootstrap

METRIC = "shapes_clip"
RESAMPLES = 10_000


def changes(curves: dict, method: str, marks: list[str]) -> np.ndarray:
    """seeds × marks held-out changes of one method (seeds that reached every mark)."""
    runs = curves["runs"][method]
    rows = [[runs[s][METRIC][k] for k in marks] for s in sorted(runs, key=int)]
    return np.array([r for r in rows if None not in r], dtype=float)


def share_of_final(x: np.ndarray) -> list[tuple[float, float, float]]:
    """Per mark but the last: mean(x[:, mark]) / mean(x[:, -1]) and its percentile-bootstrap
    CI, the seeds resampled together (paired) across the mark and the budget."""

    def ratio(at_mark, at_budget, axis=-1):
        return at_mark.mean(axis=axis) / at_budget.mean(axis=axis)

    shares = []
    for mark in x[:, :-1].T:
        ci = bootstrap(
            (mark, x[:, -1]),
            ratio,
            paired=True,
            vectorized=True,
            n_resamples=RESAMPLES,
            method="percentile",
            rng=np.random.default_rng(0),
        ).confidence_interval
        shares.append((float(ratio(mark, x[:, -1])), float(ci.low), float(ci.high)))
    return shares


def main(results_path: Path) -> None:
    results = json.loads(results_path.read_text())
    curves = results["curve_at_nfe"]
    marks = [str(k) for k in curves["marks"]]
    budget = results["spec"]["budget"]["nfe"]
    if int(marks[-1]) != budget:
        sys.exit(f"the last curve mark must be the budget ({budget}), got {marks[-1]}")
    fractions = ", ".join(f"{int(k) / budget:.0%}" for k in marks[:-1])
    head = f"held-out {METRIC} change at the budget"
    print(f"| method | seeds | {head} | share of it reached at {fractions} |")
    print("|---|---|---|---|")
    for method in curves["runs"]:
        x = changes(curves, method, marks)
        final = across_seeds(x[:, -1])
        shares = (
            " · ".join(f"{p:.0%} [{lo:.0%}, {hi:.0%}]" for p, lo, hi in share_of_final(x))
            if final.excludes_zero()
            else "— (change not resolved)"
        )
        change = f"{final.mean:+.4f} [{final.lo:+.4f}, {final.hi:+.4f}]"
        label = results["methods"][method]["label"]
        print(f"| {label} | {len(x)} | {change} | {shares} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
