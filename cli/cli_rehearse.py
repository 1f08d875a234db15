"""``g2rpo rehearse``: a recipe's whole data flow at its true sizes on a multi-node Ray
cluster started on this machine (orchestration/rehearsal.py)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from g2rpo.common.errors import UsageError


def _cmd_rehearse(args: argparse.Namespace) -> int:
    from g2rpo.common.config.loading import load_config

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a cluster of its own, before ray
    load_config(args.config, args.set)  # a bad config says so before Ray and torch load
    if args.out is not None:
        out = Path(args.out)
        if out.exists() and any(out.iterdir()):
            raise UsageError(f"--out {out}: not empty (a rehearsal writes a fresh directory)")
    else:
        out = Path(tempfile.mkdtemp(prefix="g2rpo-rehearsal-"))
    from g2rpo.orchestration.rehearsal import rehearse
    from g2rpo.orchestration.rehearsal_report import format_report

    result = rehearse(
        args.config,
        args.set,
        out,
        nodes=args.nodes,
        iterations=args.iterations,
        shared_run_dir=not args.private_run_dir,
        progress=not args.json,
    )
    print(
        json.dumps(result.report, indent=1, default=str)
        if args.json
        else format_report(result.report)
    )
    if result.passed and args.out is None and not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    else:
        print(f"rehearsal files: {out} (rehearsal.json, runs/, nodes/, logs/)", file=sys.stderr)
    return 0 if result.passed else 1


def add_rehearse_parser(sub) -> None:
    r = sub.add_parser(
        "rehearse",
        help="run a recipe end to end at its true data sizes on a multi-node Ray cluster "
        "started on this machine (random shrunk models, CPU); exit 1 naming the phase",
        description="Run the recipe as `g2rpo train` runs it — image size, prompts and leaves "
        "per worker, evaluation samples, reward-request sizes, weight transport, checkpoint "
        "layout, learner-group size and placement — with random models of its latent geometry "
        "shrunk in width and depth, on N Ray worker nodes started here, each in a mount "
        "namespace of its own (root), sharing only the model volume and the run directory. "
        "Two sessions: the first has a rollout worker killed mid-rollout, the second resumes "
        "the run, has a learner rank killed, finishes, exports and evaluates. Reports per "
        "phase the seconds, the bytes of each request, version and trajectory batch, memory "
        "peaks, and which files landed on which node. Exit 0: it ran; 1: a phase failed "
        "(named, with the config field to look at); 2: bad input.",
    )
    r.add_argument("config", help="run config (YAML), e.g. configs/flux_hps.yaml")
    r.add_argument("--set", action="append", default=[], metavar="a.b=c", help="override")
    r.add_argument("--nodes", type=int, default=2, help="Ray worker nodes besides the head")
    r.add_argument(
        "--iterations", type=int, default=2, help="iterations in all (the last after a resume)"
    )
    r.add_argument(
        "--out", default=None, help="directory for the rehearsal (default: a temporary one)"
    )
    r.add_argument(
        "--private-run-dir",
        action="store_true",
        help="give each node its own run.output_dir (no shared filesystem): shows how a "
        "cluster without one fails",
    )
    r.add_argument("--keep", action="store_true", help="keep the temporary directory")
    r.add_argument("--json", action="store_true", help="print the report as JSON")
    r.set_defaults(func=_cmd_rehearse)
