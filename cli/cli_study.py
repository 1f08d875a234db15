"""``g2rpo hacking sheets | measure | study``: the pre-registered reward-hacking study's
three steps (docs/results/hacking/preregistration.md): the readers' sheets, the measures
from the kept images, and the analysis from the committed measures and labels."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _runs(paths: list[str]) -> list[Path]:
    from g2rpo.common.errors import UsageError

    runs = [Path(p) for p in paths]
    for run in runs:
        if not (run / "config.yaml").is_file():
            raise UsageError(f"RUN {run}: not a run directory (no config.yaml)")
    return runs


def _cmd_sheets(args: argparse.Namespace) -> int:
    from g2rpo.evaluation.study_sheets import write_sheets

    key = write_sheets(_runs(args.runs), Path(args.out), seed=args.seed)
    print(f"sheets in {args.out} (READ_IN_THIS_ORDER.txt); the key, not for readers: {key}")
    return 0


def _cmd_measure(args: argparse.Namespace) -> int:
    from g2rpo.evaluation.study_measures import write_measures

    written = write_measures(_runs(args.runs), Path(args.out), progress=not args.no_progress)
    print(f"measured {len(written)} runs into {args.out}")
    return 0


def _cmd_study(args: argparse.Namespace) -> int:
    from g2rpo.evaluation.prereg_study import study, table

    results = study(Path(args.measures), Path(args.labels))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "table.md").write_text(table(results))
    print(table(results), end="")
    return 0


def add_study_parsers(checks) -> None:
    sheets = checks.add_parser(
        "sheets", help="the study's readers' sheets: every sample of every evaluation, anonymised"
    )
    sheets.add_argument("runs", nargs="+", metavar="RUN", help="run directories")
    sheets.add_argument("--out", required=True, help="a directory for the sheets")
    sheets.add_argument("--seed", type=int, default=0, help="the ids' and order's seed")
    sheets.set_defaults(func=_cmd_sheets)

    measure = checks.add_parser(
        "measure", help="the study's measures of runs' kept evaluation images (json.gz a run)"
    )
    measure.add_argument("runs", nargs="+", metavar="RUN", help="run directories")
    measure.add_argument("--out", required=True, help="the measures' directory")
    measure.add_argument("--no-progress", action="store_true")
    measure.set_defaults(func=_cmd_measure)

    st = checks.add_parser(
        "study", help="the pre-registered study's results from committed measures and labels"
    )
    st.add_argument("--measures", default="docs/results/hacking/study/measures")
    st.add_argument("--labels", default="docs/results/hacking/study/labels")
    st.add_argument("--out", default="docs/results/hacking/study")
    st.set_defaults(func=_cmd_study)
