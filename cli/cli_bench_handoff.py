"""``g2rpo bench handoff``: a full-size weight version handed from a learner process to
a rollout-worker process as it crosses Ray, with each process's host memory (no Ray)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from g2rpo.cli_one_node import add_one_node_arguments, one_node_config, parse_blocks


def _cmd_bench_handoff(args: argparse.Namespace) -> int:
    cfg, _ = one_node_config(args)
    blocks = parse_blocks(args)
    from g2rpo.benchmarks.handoff import bench_handoff, format_handoff
    from g2rpo.planning.doctor import random_weights_config

    with tempfile.TemporaryDirectory(prefix="g2rpo-handoff-") as tmp:
        if args.random_weights is not None:
            # --work-dir keeps the pipeline for later checks (bin/gpu-check's next stages)
            where = Path(args.work_dir) if args.work_dir else Path(tmp)
            print(f"g2rpo bench handoff: random {args.random_weights} -> {where}", file=sys.stderr)
            cfg = random_weights_config(cfg, where, args.random_weights, blocks)
        result = bench_handoff(cfg, args.store_dir)
    print(json.dumps(result) if args.json else format_handoff(result))
    worker = result["worker"]
    return 0 if worker["holds_the_version"] else 1


def add_handoff_parser(bench_sub) -> None:
    h = bench_sub.add_parser(
        "handoff",
        help="a full-size weight version from a learner process to a worker process, as it "
        "crosses Ray (one shared-memory copy, read as views), with each process's host memory",
        description="Without Ray, on one node: a worker process builds its core while this "
        "process builds a one-rank learner (FSDP2 for a full fine-tune), gathers the "
        "version, puts it in its published form into one file under --store-dir (as ray.put "
        "does into /dev/shm) and drops its copy; the worker maps it, verifies and loads it "
        "onto its device and checks what it holds. Per step: seconds, host memory of each "
        "process, the worker's private growth against the version's size.",
    )
    add_one_node_arguments(h)
    h.add_argument(
        "--work-dir",
        default=None,
        help="build --random-weights' pipeline here and keep it (default: a temporary dir)",
    )
    h.add_argument("--store-dir", default="/dev/shm", help="where the version's copy lies")
    h.add_argument("--json", action="store_true")
    h.set_defaults(func=_cmd_bench_handoff)
