"""An evaluation's metrics-row entries: each metric's mean and its paired change since the
run's first evaluation (same prompts, same noise) with its 95% CI, and the trained-vs-held-
out reward drift. Pure on evaluation records (evals/it_N.json), so the driver, the run
report, the rehearsal and the hacking study read an evaluation the same way."""

from __future__ import annotations

import numpy as np

from .files import record_values

HEALTH = "health/"  # the image-health measures' prefix among an evaluation's values


def eval_row(values: dict, first: dict | None, per_prompt: int) -> dict:
    """Row entries of one evaluation: the mean of each metric and, against the run's
    first evaluation (same prompts, same noise), the paired change with its 95% CI."""
    from ..common.algorithms.stats import paired_difference, per_prompt_means

    row = {f"eval/{k}": float(np.mean(v)) for k, v in values.items()}
    if first is None:
        return row
    n_prompts = len(first["prompts"])
    before = record_values(first)
    for k, v in values.items():
        if k in before and len(before[k]) == len(v):
            diff = paired_difference(
                per_prompt_means(v, n_prompts), per_prompt_means(before[k], n_prompts)
            )
            row[f"eval/{k}/delta"] = diff.mean
            row[f"eval/{k}/delta_lo"] = diff.lo
            row[f"eval/{k}/delta_hi"] = diff.hi
    return row


def held_out_metrics(row: dict, trained) -> list[str]:
    """The evaluation's reward metrics the run does not train on (a trained scorer's
    parts, as the checker's ``/pass``, count as trained)."""
    names = {k[len("eval/") :].removesuffix("/delta") for k in row if k.endswith("/delta")}
    return sorted(
        n
        for n in names
        if not n.startswith(HEALTH)
        and not n.startswith("drift/")
        and n.split("/")[0] not in trained
    )


def drift_entries(row: dict, trained: dict[str, float]) -> dict:
    """The trained-vs-held-out divergence of one evaluation: ``eval/drift/diverging`` is 1
    when a trained reward moved the way it is paid for since the first evaluation (95% CI
    above 0, or below 0 for a negative weight) while a held-out reward's fell (CI below 0),
    else 0: the run pleases its reward and loses what it was not paid for.
    ``eval/drift/<metric>`` repeats each held-out metric's change. ``trained``: each trained
    reward's weight. Nothing without a first evaluation or a held-out scorer."""
    held_out = held_out_metrics(row, trained)
    gains = [
        row[f"eval/{n}/delta_lo"] if w >= 0 else -row[f"eval/{n}/delta_hi"]
        for n, w in trained.items()
        if f"eval/{n}/delta_lo" in row and w != 0
    ]
    if not held_out or not gains:
        return {}
    out = {f"eval/drift/{n}": row[f"eval/{n}/delta"] for n in held_out}
    falling = any(row[f"eval/{n}/delta_hi"] < 0 for n in held_out)
    out["eval/drift/diverging"] = float(max(gains) > 0 and falling)
    return out


def evaluation_change(first: dict, record: dict) -> dict:
    """``eval_row`` of a saved evaluation record (evals/it_N.json) against the run's
    first: each metric's mean, and its paired change since ``first`` with its 95% CI."""
    return eval_row(record_values(record), first, record["per_prompt"])
