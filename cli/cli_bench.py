"""``g2rpo bench ...``: the benchmark commands (engine, reward server, learner,
weight publishing)."""

from __future__ import annotations

import argparse
import json

from g2rpo.cli_args import int_list
from g2rpo.common.errors import UsageError


def _cmd_bench_reward(args: argparse.Namespace) -> int:
    from g2rpo.benchmarks.reward import bench_reward

    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be at least 1 (got {args.threads})")
    result = bench_reward(
        scorer=args.scorer,
        duration_s=args.duration,
        per_request=args.images_per_request,
        device=args.device,
        random_model=args.random_model,
        image_size=args.image_size,
        threads=args.threads,
    )
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"scorer {result['scorer']}, {result['images_per_request']} images per request")
    for key in ("batched", "unbatched"):
        for r in result[key]:
            print(
                f"  {key:9s} {r['clients']:3d} clients: {r['images_per_s']:8.1f} images/s, "
                f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms"
            )
    for n, r in result["replicas"].items():
        print(
            f"  {n} replica(s), {r['clients']} clients: {r['images_per_s']:.1f} images/s, "
            f"p99 {r['p99_ms']:.1f} ms"
        )
    print(f"  batching gain {result['batching_gain']}x, replica gain {result['replica_gain']}x")
    return 0


def _cmd_bench_learner(args: argparse.Namespace) -> int:
    import torch
    from g2rpo.benchmarks.learner import bench_learner

    if args.threads:
        torch.set_num_threads(args.threads)
    result = bench_learner(
        device=args.device,
        size=args.size,
        dtype=args.dtype,
        latent_size=args.latent_size,
        num_prompts=args.prompts,
        group_size=args.group_size,
        lora_rank=args.lora_rank,
        repeats=args.repeats,
        attention_backend=args.attention_backend,
        adamw_implementation=args.adamw,
    )
    if args.json:
        print(json.dumps(result))
        return 0
    s = result["settings"]
    print(
        f"one GRPO update: {s['transitions']} transitions ({s['num_prompts']} prompts x "
        f"{len(s['sde_steps'])} SDE steps x G={s['group_size']}), {s['preset']} model "
        f"{s['parameters']:,} params, {s['compute_dtype']} compute on {s['device']}"
    )
    for mode in ("full", "lora"):
        r = result[mode]
        mfu = f", MFU {r['mfu']:.1%}" if r["mfu"] else ""
        print(
            f"  {mode:4s}: {r['seconds_per_update']:.3f} s, {r['flops_per_update'] / 1e9:.2f} "
            f"GFLOP, {r['tflops']:.3f} TFLOP/s{mfu} ({r['trainable_parameters']:,} trained)"
        )
    return 0


def _cmd_bench_weights(args: argparse.Namespace) -> int:
    if args.verify_gb is not None:
        return _cmd_bench_verification(args)
    from g2rpo.benchmarks.weights import bench_weights

    result = bench_weights(
        sizes=args.sizes.split(","),
        workers=args.workers,
        lora_rank=args.lora_rank,
        repeats=args.repeats,
        device=args.device,
        modes=args.modes.split(","),
    )
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        "one weight version to every worker, verified and loaded: object store, broadcast; "
        "vs one put+get of the same bytes to one worker"
    )
    for key, r in result.items():
        if key == "settings":
            continue
        print(
            f"  {key:22s} {r['bytes'] / 2**20:8.2f} MiB: store {r['publish_and_load_s']:.4f} s "
            f"({r['path_vs_floor']:.2f}x), broadcast {r['broadcast_and_load_s']:.4f} s "
            f"({r['broadcast_vs_floor']:.2f}x), floor {r['put_get_one_worker_s']:.4f} s"
        )
    return 0


def _cmd_bench_verification(args: argparse.Namespace) -> int:
    from g2rpo.benchmarks.weights_verify import bench_verification

    result = bench_verification(args.verify_gb, args.repeats)
    if args.json:
        print(json.dumps(result))
        return 0
    print("verifying one weight version (FLUX-like tensors), seconds per GB; host copy beside")
    for key, r in result.items():
        if key == "settings":
            continue
        print(
            f"  {key:8s} {r['bytes'] / 1e9:6.2f} GB: SHA-256 {r['sha256_s_per_gb']:.4f}, "
            f"XXH3-128 {r['xxh3_s_per_gb']:.4f} ({r['sha256_vs_xxh3']:.1f}x faster), "
            f"host copy {r['host_copy_s_per_gb']:.4f}"
        )
    return 0


def _cmd_bench_plan_memory(args: argparse.Namespace) -> int:
    from g2rpo.benchmarks.plan_memory import bench_plan_memory

    result = bench_plan_memory(args.device, tuple(args.sizes), batches=tuple(args.batches))
    if args.json:
        print(json.dumps(result))
        return 0
    s = result.pop("settings")
    print(f"peak memory of one call, measured vs planned ({s['device_name']}, torch {s['torch']})")
    for name, r in result.items():
        print(
            f"  {name:28s} measured {r['measured_gib']:7.3f} GiB  traced {r['traced_gib']:7.3f}  "
            f"plan {r['plan_gib']:7.3f}  measured/plan {r['measured_over_plan']:.3f}"
        )
    return 0


def _cmd_bench_precision(args: argparse.Namespace) -> int:
    from g2rpo.benchmarks.precision import bench_precision

    result = bench_precision(
        args.config,
        args.set,
        settings=args.settings.split(",") if args.settings else None,
        prompts=args.prompts,
        device=args.device,
    )
    if args.json:
        print(json.dumps(result))
        return 0
    s = result["settings"]
    print(
        f"PPO ratio before any update, rollout vs learner: {s['transitions']} SDE transitions "
        f"of {s['prompts']} prompts ({s['config']}, {s['device']}); clip range {s['clip_range']}"
    )
    for name, r in result.items():
        if name == "settings":
            continue
        print(
            f"  {name:34s} max |r-1| {r['max_abs_ratio_minus_1']:.2e} "
            f"({r['max_over_clip']:.2f} of the clip), mean {r['mean_abs_ratio_minus_1']:.2e}, "
            f"clipped {r['clipped_at_first_step']:.1%}, {r['published_bytes'] / 2**20:.2f} MiB"
        )
    return 0


def _cmd_bench_health(args: argparse.Namespace) -> int:
    from g2rpo.benchmarks.health import bench_health

    result = bench_health(args.sizes, images=args.images, repeats=args.repeats)
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        "image-health measures, CPU seconds per image "
        f"(best of {args.repeats}, {args.images} images)"
    )
    for size, stages in result.items():
        total = sum(stages.values())
        cells = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in stages.items())
        print(
            f"  {size}x{size}: {cells}; {total * 1e3:.2f} ms in all, "
            f"{total * args.per_eval:.1f} s for an evaluation of {args.per_eval} samples"
        )
    from g2rpo.benchmarks.health import bench_measures

    print("each per-image measure alone (its own luminance and spectra), CPU ms per image")
    for size, costs in bench_measures(args.sizes, args.images, args.repeats).items():
        print(f"  {size}x{size}: " + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in costs.items()))
    return 0


def add_bench_parsers(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True, metavar="WHAT")
    from g2rpo.cli_bench_engine import add_engine_parser

    add_engine_parser(bench_sub)

    rb = bench_sub.add_parser("reward", help="reward-server throughput and latency")
    rb.add_argument("--json", action="store_true")
    rb.add_argument("--scorer", default="shapes_clip", help="NAME or NAME=LOCAL_DIR")
    rb.add_argument("--device", default="cpu", help="where the servers score: cpu, cuda")
    rb.add_argument(
        "--random-model",
        default=None,
        choices=["vit-h-14", "tiny"],
        help="serve a random CLIP-family model of this size as --scorer (hpsv2, clip_score, "
        "pickscore): HPS-v2.1/DFN5B/PickScore's ViT-H-14 without a download",
    )
    rb.add_argument("--image-size", type=int, default=32, help="side of the images sent")
    rb.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads of the single server (default: every core; each of the two "
        "replicas gets half)",
    )
    rb.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    rb.add_argument(
        "--images-per-request",
        type=int,
        default=32,
        help="images per request (a rollout worker sends G·K·|granularities| per prompt: 192 "
        "in the paper's setting)",
    )
    rb.set_defaults(func=_cmd_bench_reward)

    ln = bench_sub.add_parser("learner", help="one GRPO update (full and LoRA): time, TFLOP/s, MFU")
    ln.add_argument("--device", default="cpu")
    ln.add_argument("--size", choices=["test", "bench", "gpu", "flux"], default=None)
    ln.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    ln.add_argument("--latent-size", type=int, default=None)
    ln.add_argument("--prompts", type=int, default=2)
    ln.add_argument("--group-size", type=int, default=4)
    ln.add_argument("--lora-rank", type=int, default=16)
    ln.add_argument("--repeats", type=int, default=3)
    ln.add_argument("--threads", type=int, default=None)
    ln.add_argument(
        "--attention-backend",
        choices=["auto", "flash", "efficient", "cudnn", "math"],
        default="auto",
    )
    ln.add_argument(
        "--adamw",
        choices=["auto", "fused", "foreach", "for_loop"],
        default="auto",
        help="AdamW's kernel (optim.implementation)",
    )
    ln.add_argument("--json", action="store_true")
    ln.set_defaults(func=_cmd_bench_learner)

    wt = bench_sub.add_parser(
        "weights",
        help="weight publish + load (object store, broadcast) vs one object-store put+get",
    )
    wt.add_argument("--sizes", default="test,bench", help="model presets, comma-separated")
    wt.add_argument(
        "--workers", type=int_list, default=[1, 2], help="worker counts, comma-separated"
    )
    wt.add_argument(
        "--modes", default="full,full_bf16,lora", help="full, full_bf16, lora (comma-separated)"
    )
    wt.add_argument("--lora-rank", type=int, default=16)
    wt.add_argument("--repeats", type=int, default=3)
    wt.add_argument("--device", default="cpu")
    wt.add_argument(
        "--verify-gb",
        type=float,
        default=None,
        metavar="GB",
        help="instead: the checksum alone, SHA-256 (before) vs XXH3-128, on GB of "
        "FLUX-like fp32 and bf16 tensors (CPU, no Ray)",
    )
    wt.add_argument("--json", action="store_true")
    wt.set_defaults(func=_cmd_bench_weights)
    pr = bench_sub.add_parser(
        "precision",
        help="PPO ratio before any update under each precision setting (rollout vs learner)",
    )
    pr.add_argument("--config", default="configs/tiny.yaml", help="base run config")
    pr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    pr.add_argument("--settings", default=None, help="comma-separated (default: all)")
    pr.add_argument("--prompts", type=int, default=8, help="train prompts rolled out")
    pr.add_argument("--device", default=None, help="cpu | cuda (default: the config's)")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(func=_cmd_bench_precision)
    hl = bench_sub.add_parser(
        "health", help="CPU cost of the image-health measures per image and per evaluation"
    )
    hl.add_argument("--sizes", type=int_list, default=[32, 512, 720, 1024], help="image sides, px")
    hl.add_argument("--images", type=int, default=32)
    hl.add_argument("--repeats", type=int, default=3)
    hl.add_argument("--per-eval", type=int, default=2048, help="samples of the evaluation costed")
    hl.add_argument("--json", action="store_true")
    hl.set_defaults(func=_cmd_bench_health)
    pm = bench_sub.add_parser(
        "plan-memory",
        help="the memory plan's VAE decode and transformer call vs the same calls on a CUDA GPU",
    )
    pm.add_argument("--device", default="cuda")
    pm.add_argument("--sizes", type=int_list, default=[512, 720], help="image sizes, px")
    pm.add_argument(
        "--batches", type=int_list, default=[1, 4], help="samples in each transformer call"
    )
    pm.add_argument("--json", action="store_true")
    pm.set_defaults(func=_cmd_bench_plan_memory)
    from g2rpo.cli_bench_memory import add_weights_memory_parser

    add_weights_memory_parser(bench_sub)
    from g2rpo.cli_bench_handoff import add_handoff_parser

    add_handoff_parser(bench_sub)
    from g2rpo.cli_bench_ipc_handoff import add_ipc_handoff_parser

    add_ipc_handoff_parser(bench_sub)
    from g2rpo.cli_bench_replay import add_replay_parser

    add_replay_parser(bench_sub)
