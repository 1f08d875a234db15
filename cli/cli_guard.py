"""``g2rpo export`` (a run's checkpoint as diffusers weights, the guard's healthy one
included) and ``g2rpo guard calibrate`` (train.guard's rules fitted to clean runs)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _cmd_export(args: argparse.Namespace) -> int:
    from g2rpo.evaluation.export_weights import export_checkpoint

    path = export_checkpoint(args.run, args.checkpoint, args.out)
    print(f"exported {args.run} --checkpoint {args.checkpoint} to {path}")
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from g2rpo.common.errors import UsageError
    from g2rpo.evaluation.guard_calibration import calibrate, rules_yaml
    from g2rpo.run_directory.files import read_metrics

    runs = {}
    for run in args.runs:
        rows = read_metrics(run)
        if not rows:
            raise UsageError(f"RUN {run}: no metrics.jsonl rows (is it a run directory?)")
        runs[Path(run).name] = rows
    out = calibrate(runs, margin=args.margin)
    if args.json:
        out = {**out, "rules": [r.describe() for r in out["rules"]]}
        print(json.dumps(out, indent=1))
        return 0
    print(f"# train.guard rules fitted to {len(runs)} clean run(s) (margin {args.margin:g}):")
    for name, why in out["left_out"].items():
        print(f"#   left out {name}: {why}")
    print(rules_yaml(out["rules"]), end="")
    return 0


def add_guard_parsers(sub) -> None:
    ex = sub.add_parser(
        "export", help="write a run's checkpoint (healthy, latest, N) as diffusers weights"
    )
    ex.add_argument("run", help="run directory")
    ex.add_argument(
        "--checkpoint",
        default="healthy",
        help="healthy (train.guard's last healthy evaluation, healthy.json; default), "
        "latest, an iteration number or a checkpoint name",
    )
    ex.add_argument("--out", required=True, help="a new directory")
    ex.set_defaults(func=_cmd_export)

    guard = sub.add_parser("guard", help="train.guard tools")
    guard_sub = guard.add_subparsers(dest="guard_cmd", required=True, metavar="WHAT")
    cal = guard_sub.add_parser(
        "calibrate",
        help="train.guard rules fitted to clean runs of a recipe (runs a reader saw no hack in)",
    )
    cal.add_argument("runs", nargs="+", metavar="RUN", help="clean run directories")
    cal.add_argument(
        "--margin",
        type=float,
        default=1.5,
        help="each threshold at least this × the largest level a clean run held (1.5)",
    )
    cal.add_argument("--json", action="store_true", help="rules, levels and left-out signals")
    cal.set_defaults(func=_cmd_calibrate)
