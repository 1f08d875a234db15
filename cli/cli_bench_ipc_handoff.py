"""``g2rpo bench ipc-handoff``: the colocated handoff's protocol between two processes on
one device (CUDA IPC handles on a GPU, shared memory on the CPU): seconds per GiB and the
bytes that cross host memory."""

from __future__ import annotations

import argparse
import json


def _cmd_bench_ipc_handoff(args: argparse.Namespace) -> int:
    from g2rpo.benchmarks.ipc_handoff import bench_ipc_handoff, format_ipc_handoff

    result = bench_ipc_handoff(
        args.device, args.gib, args.tensor_mib, args.bucket_mib, args.repeats
    )
    print(json.dumps(result) if args.json else format_ipc_handoff(result))
    return 0 if result["checksums_agree"] and result["bytes_agree"] else 1


def add_ipc_handoff_parser(bench_sub) -> None:
    h = bench_sub.add_parser(
        "ipc-handoff",
        help="the colocated weight handoff between two processes on one device: seconds per "
        "GiB, and the bytes through host memory (handles only)",
        description="A sender process hands a random bfloat16 version to a receiver process "
        "on the same device bucket by bucket (common/wire/ipc_handoff.py: CUDA IPC handles on a "
        "GPU, shared-memory handles on the CPU), as learner rank i hands rollout worker i a "
        "version in train.placement colocated; the receiver starts from zeros. No Ray.",
    )
    h.add_argument("--device", default="cpu", help="cpu | cuda")
    h.add_argument("--gib", type=float, default=0.25, help="the version's size")
    h.add_argument("--tensor-mib", type=int, default=64, help="each tensor's size")
    h.add_argument("--bucket-mib", type=int, default=512, help="one bucket on the device")
    h.add_argument("--repeats", type=int, default=3, help="timed handoffs after a first")
    h.add_argument("--json", action="store_true")
    h.set_defaults(func=_cmd_bench_ipc_handoff)
