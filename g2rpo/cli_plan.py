"""``g2rpo plan``: each actor's estimated peak GPU memory, before any launch."""

from __future__ import annotations

import argparse
import json


def _cmd_plan(args: argparse.Namespace) -> int:
    from g2rpo.common.config import load_config
    from g2rpo.planning.check import EXIT_MISFIT, format_table, parse_gib, report

    gib = parse_gib(args.gpu_memory) if args.gpu_memory is not None else None
    cfg = load_config(args.config, args.set)
    rep = report(cfg, gib)
    print(json.dumps(rep, indent=2) if args.json else format_table(rep))
    return 0 if rep["fits"] else EXIT_MISFIT


def add_plan_parsers(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="estimate each actor's peak GPU memory (no weights loaded); exit 3 if one misfits",
        description="Estimated peak device memory of each actor kind (rollout worker, learner "
        "rank, evaluator, reward replica), what it is made of, whether it fits its GPU share, "
        "and the cheapest changes that make a misfit fit. Exit code: 0 all fit, 3 some actor "
        "does not fit, 2 bad input.",
    )
    p.add_argument("config", help="run config (YAML)")
    p.add_argument("--set", action="append", default=[], metavar="a.b=c", help="override")
    p.add_argument(
        "--gpu-memory",
        default=None,
        metavar="SIZE",
        help="memory of one GPU, e.g. 80GiB or 141 (default: train.gpu_memory_gib)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=_cmd_plan)
