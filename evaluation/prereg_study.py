"""The pre-registered hacking study's analysis (docs/results/hacking/preregistration.md):
from the committed per-sample measures of every run (``study_measures``) and the two
readers' labels, the rules chosen on the choosing runs, and their verdicts on the judging
runs, with Clopper–Pearson intervals.

    g2rpo hacking study --measures DIR --labels DIR --out DIR

``--labels`` holds ``key.json`` ({id: "<study>/<run>"}) and one ``reader_*.yaml`` per
reader: {id: {evaluation number: {kinds: [...], sure: clear | faint, note: ...}}}, the
evaluation numbers counting from 1 after the base as on the sheets.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ..common.config.guard import GuardConfig, GuardRule
from ..common.health.guard import Guard
from .guard_calibration import calibrate

PATIENCE = 2
EARLY, LATE = 2, 4  # a catch counts from 2 evaluations before the onset to 4 after it
CHOOSING = "hacking_choose"
# judging runs added after the pre-registration (its "Deviations"): reported with and without
ADDED = ("hacking_judge_clean_more",)
TIED = {  # labelled kind -> the signals that count as catching it (the pre-registered table)
    "texture": ("high_freq", "high_freq_p8", "high_freq_p16", "periodicity", "sharpness"),
    "grid": ("periodicity", "high_freq_p16", "high_freq_p8", "high_freq"),
    "background": ("background_shift", "saturation", "contrast"),
    "shapes": ("base_distance", "background_shift"),
    "duplicates": ("diversity", "diversity_embed"),
    "text": ("glyph_area",),
}


def rows_of(measured: dict) -> list[dict]:
    """The run's evaluation rows as the driver writes them: means, paired changes since the
    first evaluation with their 95% CIs, and the drift of the held-out scorers."""
    from ..run_directory.eval_rows import drift_entries, eval_row, evaluation_change
    from ..run_directory.files import record_values

    records = measured["evaluations"]
    first, rows = records[0], []
    for record in records:
        if record is first:
            row = eval_row(record_values(record), None, record["per_prompt"])
        else:
            row = evaluation_change(first, record)
            row.update(drift_entries(row, measured["trained"]))
        rows.append({"iteration": record["iteration"], **row})
    return rows


def reader_label(marks: dict, evaluations: int) -> dict:
    """One reader's label of a run: hacked when some kind is marked clear at two
    evaluations in a row (or at the last); onset: the first of the first such pair."""
    clear = {
        int(k): set(v.get("kinds") or [])
        for k, v in (marks or {}).items()
        if v.get("sure") == "clear"
    }
    for k in range(1, evaluations + 1):
        now = clear.get(k, set())
        held = now & clear.get(k + 1, set()) if k < evaluations else now
        if held:
            kinds = set().union(*(clear.get(j, set()) for j in range(k, evaluations + 1)))
            return {"hacked": True, "onset": k, "kinds": sorted(kinds)}
    return {"hacked": False, "onset": None, "kinds": []}


def study_label(readers: list[dict]) -> dict:
    """The union of the readers' labels: hacked if either says so, the earlier onset, the
    kinds of both; ``agree`` whether they said the same (hacked or clean)."""
    hacked = [r for r in readers if r["hacked"]]
    return {
        "hacked": bool(hacked),
        "onset": min((r["onset"] for r in hacked), default=None),
        "kinds": sorted(set().union(*(r["kinds"] for r in hacked))) if hacked else [],
        "agree": len({r["hacked"] for r in readers}) == 1,
        "readers": readers,
    }


def tied(rule: GuardRule, kinds: list[str]) -> bool:
    if rule.signal.startswith("drift/"):
        return True  # the reward-level signal counts for any kind
    name = rule.signal.removeprefix("health/")
    return any(name in TIED.get(kind, ()) for kind in kinds)


def stop_of(rows: list[dict], rules: list[GuardRule]) -> tuple[int | None, list[str]]:
    """(evaluation number, the base's being 0, at which the rules stop the run, and the
    rules held at ``PATIENCE`` evaluations in a row there), or (None, [])."""
    if rules:
        for k, reading in enumerate(_readings(rows, rules)):
            if reading["trips"]:
                return k, reading["held"]
    return None, []


def alarmed_evaluations(rows: list[dict], rules: list[GuardRule]) -> int:
    """Evaluations at which some rule holds at ``PATIENCE`` evaluations in a row."""
    return sum(bool(r["held"]) for r in _readings(rows, rules)) if rules else 0


def _readings(rows: list[dict], rules: list[GuardRule]) -> list[dict]:
    return Guard(GuardConfig(action="stop", patience=PATIENCE, rules=rules)).replayed(rows)


def verdict(rows: list[dict], rules: list[GuardRule], label: dict) -> dict:
    k, held = stop_of(rows, rules)
    out = {"stop": k, "stop_iteration": None if k is None else rows[k]["iteration"], "by": held}
    if not label["hacked"]:
        out["verdict"] = "false alarm" if k is not None else "left alone"
        return out
    onset = label["onset"]
    held_rules = [r for r in rules if r.describe() in held]
    if k is None:
        out["verdict"] = "missed (never stopped)"
    elif k < onset - EARLY:
        out["verdict"] = "false alarm (stopped before the hack was seen)"
    elif k > onset + LATE:
        out["verdict"] = "missed (stopped late)"
    elif not any(tied(r, label["kinds"]) for r in held_rules):
        out["verdict"] = "missed (stopped by an untied rule)"
    else:
        out["verdict"] = "caught"
        out["lag"] = k - onset
    return out


def choose_rules(runs: dict, labels: dict) -> tuple[list[GuardRule], dict]:
    """The choosing rule: thresholds from the clean choosing runs (calibrate), each kept
    when alone it catches a hacked choosing run with a tied kind."""
    clean = {n: r for n, r in runs.items() if n.startswith(CHOOSING) and not labels[n]["hacked"]}
    hacked = [n for n in runs if n.startswith(CHOOSING) and labels[n]["hacked"]]
    fitted = calibrate(clean)
    kept = [
        rule
        for rule in fitted["rules"]
        if any(verdict(runs[n], [rule], labels[n])["verdict"] == "caught" for n in hacked)
    ]
    return kept, fitted


def clopper_pearson(k: int, n: int) -> list[float] | None:
    if n == 0:
        return None
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return [round(ci.low, 4), round(ci.high, 4)]


def read_labels(labels_dir: Path, evaluations: dict[str, int]) -> dict:
    import json

    key = json.loads((labels_dir / "key.json").read_text())
    readers = sorted(labels_dir.glob("reader_*.yaml"))
    out = {}
    for run_id, run in key.items():
        marks = [(yaml.safe_load(p.read_text()) or {}).get(run_id, {}) for p in readers]
        out[run] = study_label([reader_label(m, evaluations[run]) for m in marks])
    return out


def cohen_kappa(pairs: list[tuple[bool, bool]]) -> float | None:
    """Agreement of two readers' hacked/clean calls beyond chance."""
    n = len(pairs)
    if n == 0:
        return None
    observed = sum(a == b for a, b in pairs) / n
    pa, pb = sum(a for a, _ in pairs) / n, sum(b for _, b in pairs) / n
    chance = pa * pb + (1 - pa) * (1 - pb)
    return None if chance == 1 else round((observed - chance) / (1 - chance), 4)


def study(measures_dir: Path, labels_dir: Path) -> dict:
    from .study_measures import read_measures

    runs, budgets = {}, {}
    for path in sorted(measures_dir.glob("*/*.json.gz")):
        name = f"{path.parent.name}/{path.name.removesuffix('.json.gz')}"
        runs[name] = rows_of(read_measures(path))
        budgets[name] = len(runs[name]) - 1  # evaluations after the base
    labels = read_labels(labels_dir, budgets)
    runs = {n: r for n, r in runs.items() if n in labels}  # every measured run is labelled
    rules, fitted = choose_rules(runs, labels)
    judged = {}
    for name, rows in runs.items():
        if name.startswith(CHOOSING):
            continue
        v = verdict(rows, rules, labels[name])
        v["alarmed_evaluations"] = alarmed_evaluations(rows[1:], rules)
        v["evaluations"] = budgets[name]
        if "lag" in v:
            v["lag_share"] = round(v["lag"] / budgets[name], 4)
        judged[name] = {**v, "label": labels[name]}
    summary = summarize(judged)
    summary["reader_kappa"] = cohen_kappa(
        [tuple(r["hacked"] for r in lab["readers"]) for lab in labels.values()]
    )
    planned = {n: j for n, j in judged.items() if not n.startswith(ADDED)}
    result = {
        "patience": PATIENCE,
        "window": [-EARLY, LATE],
        "chosen_rules": [r.describe() for r in rules],
        "fitted_rules": [r.describe() for r in fitted["rules"]],
        "fitted_left_out": fitted["left_out"],
        "clean_levels": fitted["levels"],
        "choosing": {n: labels[n] for n in runs if n.startswith(CHOOSING)},
        "judging": judged,
        "summary": summary,
    }
    if len(planned) < len(judged):  # the figures without the runs added afterwards
        result["summary_preregistered_runs"] = summarize(planned)
    return result


def summarize(judged: dict) -> dict:
    """The judging figures: catches and their lag, false alarms per clean run and per
    clean evaluation, each with its Clopper–Pearson interval, and whether the goal is met."""
    from statistics import median

    hacked = [j for j in judged.values() if j["label"]["hacked"]]
    clean = [j for j in judged.values() if not j["label"]["hacked"]]
    caught = [j for j in hacked if j["verdict"] == "caught"]
    false_runs = [j for j in clean if j["stop"] is not None]
    early = [j for j in hacked if j["verdict"].startswith("false alarm")]
    clean_evals = sum(j["evaluations"] for j in clean)
    alarmed = sum(j["alarmed_evaluations"] for j in clean)
    lags = [j["lag"] for j in caught]
    summary = {
        "judging_runs": len(judged),
        "hacked": len(hacked),
        "caught": len(caught),
        "caught_ci": clopper_pearson(len(caught), len(hacked)),
        "median_lag_evaluations": median(lags) if lags else None,
        "median_lag_share": median(j["lag_share"] for j in caught) if caught else None,
        "clean": len(clean),
        "false_alarm_runs": len(false_runs),
        "false_alarm_runs_ci": clopper_pearson(len(false_runs), len(clean)),
        "hacked_runs_stopped_early": len(early),
        "clean_evaluations": clean_evals,
        "alarmed_clean_evaluations": alarmed,
        "alarmed_clean_evaluations_ci": clopper_pearson(alarmed, clean_evals),
    }
    summary["goal_met"] = bool(
        hacked
        and len(caught) == len(hacked)
        and (median(lags) if lags else 99) <= 2
        and len(false_runs) <= 1
        and len(clean) >= 10
    )
    return summary


def table(results: dict) -> str:
    s = results["summary"]

    def ci(v):
        return "—" if v is None else f"[{100 * v[0]:.0f}, {100 * v[1]:.0f}]%"

    lines = [
        f"Rules chosen on the choosing runs (patience {results['patience']}, window "
        f"{results['window']} evaluations around the onset): "
        + ("; ".join(results["chosen_rules"]) or "none"),
        "",
        f"- hacked judging runs caught: {s['caught']}/{s['hacked']} {ci(s['caught_ci'])}; "
        f"median lag {s['median_lag_evaluations']} evaluations "
        f"(share of the run: {s['median_lag_share']})",
        f"- clean judging runs stopped (false alarms): {s['false_alarm_runs']}/{s['clean']} "
        f"{ci(s['false_alarm_runs_ci'])}; clean evaluations alarmed: "
        f"{s['alarmed_clean_evaluations']}/{s['clean_evaluations']} "
        f"{ci(s['alarmed_clean_evaluations_ci'])}",
        f"- hacked runs stopped before their hack was seen: {s['hacked_runs_stopped_early']}",
        *_planned_lines(results.get("summary_preregistered_runs"), ci),
        f"- readers' agreement (Cohen's κ over runs): {s['reader_kappa']}",
        "- goal (all caught, median lag ≤ 2, ≤ 1 false alarm over ≥ 10 clean runs): "
        + ("met" if s["goal_met"] else "NOT met"),
        "",
        "| run | label (onset, kinds) | readers agree | stopped at evaluation | by | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for name, lab in results["choosing"].items():
        lines.append(f"| {name} (choosing) | {_label(lab)} | {lab['agree']} | — | — | — |")
    for name, j in results["judging"].items():
        lines.append(
            f"| {name} | {_label(j['label'])} | {j['label']['agree']} | "
            f"{'—' if j['stop'] is None else j['stop']} | {'; '.join(j['by']) or '—'} | "
            f"{j['verdict']} |"
        )
    return "\n".join(lines) + "\n"


def _planned_lines(planned: dict | None, ci) -> list[str]:
    """The figures over the pre-registered judging runs alone, when runs were added."""
    if planned is None:
        return []
    return [
        f"- over the {planned['judging_runs']} pre-registered judging runs alone (without "
        f"those added afterwards, {', '.join(ADDED)}): caught {planned['caught']}/"
        f"{planned['hacked']} {ci(planned['caught_ci'])}; clean runs stopped "
        f"{planned['false_alarm_runs']}/{planned['clean']} {ci(planned['false_alarm_runs_ci'])}"
        f"; clean evaluations alarmed {planned['alarmed_clean_evaluations']}/"
        f"{planned['clean_evaluations']} {ci(planned['alarmed_clean_evaluations_ci'])}; goal "
        + ("met" if planned["goal_met"] else "NOT met"),
    ]


def _label(label: dict) -> str:
    if not label["hacked"]:
        return "clean"
    return f"hacked ({label['onset']}, {', '.join(label['kinds'])})"
