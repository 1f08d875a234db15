"""``g2rpo plan``: each actor's estimated peak GPU memory and each node's host memory,
before any launch; ``g2rpo doctor``: the check on a node."""

from __future__ import annotations

import argparse
import json
import sys

from g2rpo.cli_one_node import add_one_node_arguments, one_node_config, parse_blocks
from g2rpo.common.errors import UsageError


def _cmd_plan(args: argparse.Namespace) -> int:
    from g2rpo.common.config.loading import load_config

    cfg = load_config(args.config, args.set)  # a bad config says so before torch loads
    from g2rpo.planning.calibration import calibration
    from g2rpo.planning.check import EXIT_MISFIT, format_table, parse_gib, report
    from g2rpo.planning.timing import default_device, format_time, time_report

    gib = parse_gib(args.gpu_memory) if args.gpu_memory is not None else None
    rep = report(cfg, gib)
    try:
        cal = calibration(args.gpu or default_device(cfg), args.calibration)
    except (OSError, ValueError) as e:
        raise UsageError(f"--calibration: {e}") from None
    text = [format_table(rep)]
    try:
        rep["time"] = time_report(cfg, cal, args.network, args.gpus_per_node)
        text.append(format_time(rep["time"]))
    except KeyError as e:  # no row of a rate for this device
        rep["time"] = {"error": e.args[0]}
        text.append(f"time: {e.args[0]} (g2rpo doctor --calibration-out FILE measures them)")
    from g2rpo.common.errors import ConfigError
    from g2rpo.planning.host_report import format_host, host_report

    try:
        rep["host"] = host_report(cfg, args.gpus_per_node)
        text.append(format_host(rep["host"]))
    except ConfigError as e:  # e.g. a learner group no node of --gpus-per-node holds
        rep["host"] = {"error": str(e)}
        text.append(f"host memory: {e}")
    if args.gpus is not None:
        from g2rpo.planning.layouts import format_search, search

        memory = gib if gib is not None else cfg.train.memory.gpu_memory_gib
        found = search(cfg, args.gpus, memory, cal, args.network, args.gpus_per_node)
        rep["layouts"] = [x.__dict__ for x in found]
        text.append(format_search(found, args.gpus))
    print(json.dumps(rep, indent=2, default=str) if args.json else "\n\n".join(text))
    return 0 if rep["fits"] else EXIT_MISFIT


def add_plan_parsers(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="estimate each actor's peak GPU memory, each node's host memory and the time an "
        "iteration takes (no weights loaded); exit 3 if one misfits",
        description="Estimated peak device memory of each actor kind (rollout worker, learner "
        "rank, evaluator, reward replica), what it is made of, whether it fits its GPU share, "
        "and the cheapest changes that make a misfit fit. Exit code: 0 all fit, 3 some actor "
        "does not fit, 2 bad input. Then the seconds of each phase of an iteration and the "
        "run's GPU-hours, from the calibration table of measured rates "
        "(planning/presets/calibration.json; rates not measured on the device are named). "
        "Then each node's host RAM per phase and the object store and /dev/shm it needs "
        "(planning/host_memory.py says what each process holds in each phase).",
    )
    p.add_argument("config", help="run config (YAML)")
    p.add_argument("--set", action="append", default=[], metavar="a.b=c", help="override")
    p.add_argument(
        "--gpu-memory",
        default=None,
        metavar="SIZE",
        help="memory of one GPU, e.g. 80GiB or 141 (default: train.memory.gpu_memory_gib)",
    )
    p.add_argument(
        "--gpu",
        default=None,
        metavar="NAME",
        help="the GPU whose calibrated rates time the iteration (default: H200, the shipped "
        "table's; cpu for a CPU run); an uncalibrated GPU borrows H200's, scaled by bf16 peak",
    )
    p.add_argument(
        "--calibration",
        action="append",
        default=[],
        metavar="FILE",
        help="more calibration rows (JSON lines, as `g2rpo doctor --calibration-out` writes)",
    )
    p.add_argument(
        "--gpus",
        type=int,
        default=None,
        metavar="N",
        help="search the layouts of this batch on N GPUs and print the fastest that fits, "
        "with its --set lines",
    )
    p.add_argument(
        "--gpus-per-node",
        type=int,
        default=8,
        metavar="N",
        help="GPUs a node holds: whether the learner group spans nodes (--network), and the "
        "host-memory section: each node's RAM per phase "
        "(load, rollout, publish, learn, checkpoint, export), object store and /dev/shm, "
        "with the actors laid out as the run's placement puts them (default 8)",
    )
    p.add_argument(
        "--network",
        choices=("nvlink", "ib", "tcp"),
        default="ib",
        help="the link BETWEEN nodes a learner group spanning several crosses (within a node "
        "its ranks talk over NVLink): the FSDP2 traffic's seconds in the time estimate and in "
        "every layout --gpus compares (GB/s: the calibration table's nvlink_gbps, ib_gbps, "
        "tcp_gbps; default ib)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=_cmd_plan)


def _cmd_doctor(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from g2rpo.common.config.loading import load_config

    cfg, overrides = one_node_config(args)
    from g2rpo.planning.doctor import random_weights_config, run_doctor
    from g2rpo.planning.doctor_report import format_report

    if args.scorers:  # the configured rewards may have no weights here yet: train on these
        from g2rpo.reward_server.settings import ScorerSpec

        names = [ScorerSpec.parse(x).name for x in args.scorers]
        if {r.name for r in cfg.rewards} - set(names):
            rewards = json.dumps([{"name": n} for n in names])
            cfg = load_config(args.config, [*overrides, f"rewards={rewards}"])
            print(f"g2rpo doctor: rewards={rewards} (from --scorers)", file=sys.stderr)
    host = _host_options(args, cfg)
    blocks = parse_blocks(args)
    with tempfile.TemporaryDirectory(prefix="g2rpo-doctor-", dir=args.work_dir) as tmp:
        if args.random_weights is not None:
            print(
                f"g2rpo doctor: building random {args.random_weights} weights ...", file=sys.stderr
            )
            cfg = random_weights_config(cfg, Path(tmp), args.random_weights, blocks)
        rep = run_doctor(cfg, args.config, args.scorers or None, not args.json, host)
    if args.json:
        print(json.dumps(rep.model_dump(), indent=2))
    else:
        print(format_report(rep))
    if args.calibration_out is not None:
        from g2rpo.planning.calibration import append_rates
        from g2rpo.planning.doctor_calibration import device_name, rates_from_report

        rows = rates_from_report(cfg, rep, device_name(cfg.model.device))
        append_rates(args.calibration_out, rows)
        said = f"g2rpo doctor: {len(rows)} calibration rows -> {args.calibration_out}"
        print(said, file=sys.stderr)
    return 0 if rep.ok else 1


def _host_options(args: argparse.Namespace, cfg):
    from g2rpo.planning.doctor_host import HostOptions, parse_size

    if args.node is not None:  # a name the plan gives, checked before anything runs
        from g2rpo.planning.host_nodes import host_plan

        names = [n.name for n in host_plan(cfg, args.gpus_per_node)]
        if args.node not in names:
            raise UsageError(f"--node {args.node!r}: the plan's nodes are {', '.join(names)}")

    store = args.object_store_memory
    if store is not None:
        try:
            store = parse_size(store)
        except ValueError as e:
            raise UsageError(f"--object-store-memory: {e}") from None
    return HostOptions(args.gpus_per_node, args.node, store, args.host_only)


def add_doctor_parser(sub) -> None:
    d = sub.add_parser(
        "doctor",
        help="on one GPU node, without Ray: check its host memory against the plan, build each "
        "actor as training does and run one rollout, score, precision check, update and "
        "evaluation; exit 1 naming the phase",
        description="Check this node's MemTotal, /dev/shm and Ray object store against the "
        "host memory `g2rpo plan` says a node of the run needs (a shortfall names the setting: "
        "pod memory, /dev/shm sizeLimit, object-store-memory). Then run once what a training "
        "iteration does, on this node's device, each "
        "actor's core built exactly as training builds it (the learner as a one-rank group): "
        "publish, one rollout share, scoring in-process, the PPO ratio before any update vs "
        "the clip range, one learner update, one evaluation. Per phase: pass/fail, seconds, "
        "peak device memory beside the plan's estimate, NFE/s and MFU. Exit 0: every phase "
        "passed; 1: a phase failed (named, with the config field to look at); 2: bad input.",
    )
    add_one_node_arguments(d)
    d.add_argument(
        "--scorers",
        nargs="+",
        default=None,
        metavar="NAME[=DIR]",
        help="score with these instead of train.reward.scorers (e.g. shapes_oracle or jpeg "
        "with random weights)",
    )
    d.add_argument(
        "--work-dir",
        default=None,
        help="where --random-weights writes its pipeline (FLUX.1-dev in bf16: ~34 GB; "
        "default: the system's temporary directory)",
    )
    d.add_argument(
        "--calibration-out",
        default=None,
        metavar="FILE",
        help="append the rates this run measured (sample, decode and learn TFLOP/s, seconds "
        "per prompt encoded) to FILE as calibration rows, for `g2rpo plan --calibration FILE`",
    )
    d.add_argument(
        "--host-only",
        action="store_true",
        help="only the first phase: this node's MemTotal, /dev/shm and object store against "
        "the host memory the plan says a node of the run needs (no model is built)",
    )
    d.add_argument(
        "--node",
        default=None,
        metavar="NAME",
        help="the plan's node this one is to be, as `g2rpo plan` names it (e.g. 'node 2'; "
        "default: the run's most demanding node)",
    )
    d.add_argument(
        "--gpus-per-node", type=int, default=8, metavar="N", help="as `g2rpo plan`'s (default 8)"
    )
    d.add_argument(
        "--object-store-memory",
        default=None,
        metavar="SIZE",
        help="the object store Ray has (or will have) on this node, bytes or e.g. 56GiB "
        "(default: asked of the Ray this process joins, when RAY_ADDRESS names one)",
    )
    d.add_argument("--json", action="store_true", help="print the report as JSON")
    d.set_defaults(func=_cmd_doctor)
