"""``g2rpo bench weights-memory``: each worker's host-memory growth while it loads a
published weight version, zero-copy (as training publishes) or ``--pickled``."""

from __future__ import annotations

import argparse
import json


def _cmd_bench_weights_memory(args: argparse.Namespace) -> int:
    from g2rpo.benchmarks.weights_memory import bench_weights_memory, format_memory

    result = bench_weights_memory(int(args.gib * 2**30), args.pickled, args.workers)
    print(json.dumps(result) if args.json else format_memory(result))
    return 0


def add_weights_memory_parser(bench_sub) -> None:
    wm = bench_sub.add_parser(
        "weights-memory",
        help="each worker's private and shared host-memory growth while loading a weight "
        "version from the object store (zero-copy, or --pickled as before)",
        description="Publishes one bf16 version of --gib to --workers worker actors on a "
        "local Ray of its own (object store sized for it) and samples each worker's "
        "/proc/PID/status every millisecond while they verify and load it: private growth "
        "(RssAnon) against the version's size, and the object store's shared pages each maps "
        "(RssShmem; RssFile where the store is on disk). Needs about (2 + workers) x --gib "
        "of free memory, twice that for each worker's copy with --pickled.",
    )
    wm.add_argument("--gib", type=float, default=2.0, help="the version's size in GiB")
    wm.add_argument("--workers", type=int, default=2, help="worker actors loading it")
    wm.add_argument(
        "--pickled",
        action="store_true",
        help="put the version as torch tensors, as before: each worker unpickles a copy",
    )
    wm.add_argument("--json", action="store_true")
    wm.set_defaults(func=_cmd_bench_weights_memory)
