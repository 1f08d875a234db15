"""The plan's time estimate held against a rehearsal's measured phases.

    python docs/rehearsals/plan_vs_rehearsal.py REHEARSAL_DIR [--calibration FILE ...]

REHEARSAL_DIR is a ``g2rpo rehearse CONFIG --out DIR``; the estimate is the plan of
its ``rehearsal.yaml`` at the calibration table's CPU rows (the shipped ones were
measured by ``g2rpo doctor DIR/rehearsal.yaml --calibration-out FILE`` on the
development machine). Prints, per phase, the estimate, each iteration's measurement
(the driver's ``time/<phase>_s``) and the estimate's error against their mean."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from g2rpo.common.config.loading import load_config
from g2rpo.planning.calibration import calibration
from g2rpo.planning.timing import estimate_time

MEASURED = {  # estimate's phase -> the metrics row's key
    "publish": "time/publish_s",
    "rollout": "time/rollout_s",
    "reward": "time/reward_s",
    "learn": "time/learn_s",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rehearsal")
    ap.add_argument("--calibration", action="append", default=[])
    args = ap.parse_args()
    root = Path(args.rehearsal)
    cfg = load_config(root / "rehearsal.yaml")
    tm = estimate_time(cfg, calibration("cpu", args.calibration))
    rows = [json.loads(x) for m in root.glob("runs/*/metrics.jsonl") for x in m.open()]
    print("| phase | estimate s | measured s (each iteration) | error |")
    print("|---|---|---|---|")
    for phase, key in MEASURED.items():
        seen = [r[key] for r in rows if key in r]
        mean = sum(seen) / len(seen)
        err = (tm.phases[phase] - mean) / mean
        shown = ", ".join(f"{x:.2f}" for x in seen)
        print(f"| {phase} | {tm.phases[phase]:.2f} | {shown} | {err:+.0%} |")
    evals = [r["time/eval_work_s"] for r in rows if r.get("time/eval_work_s")]
    if evals:  # one evaluation's worker slice, not spread over the iterations
        per_iteration = tm.phases.get("evaluation (workers' slices, per iteration)", 0.0)
        est = per_iteration * cfg.train.eval.every
        err = (est - evals[0]) / evals[0]
        print(f"| evaluation (one, a worker's slice) | {est:.2f} | {evals[0]:.2f} | {err:+.0%} |")
    for n in tm.notes:
        print(f"\nnote: {n}")


if __name__ == "__main__":
    main()
