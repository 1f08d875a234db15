"""``g2rpo bench engine``: the batched tree engine against the official-order reference
loop (NFEs, wall time, parity, TFLOP/s, MFU), eager or with the repeated blocks compiled."""

from __future__ import annotations

import argparse
import json
import sys

from g2rpo.cli_args import int_list
from g2rpo.common.errors import UsageError


def _cmd_bench_engine(args: argparse.Namespace) -> int:
    import torch
    from g2rpo.benchmarks.rollout import bench_engine, format_compiled, format_engine_only

    if args.threads:
        torch.set_num_threads(args.threads)
    result = bench_engine(
        quick=args.quick,
        device=args.device,
        size=args.size,
        dtype=args.dtype,
        latent_size=args.latent_size,
        num_steps=args.steps,
        group_size=args.group_size,
        sde_steps=args.sde_steps,
        granularities=args.granularities,
        terminal=args.terminal,
        num_prompts=args.prompts,
        max_batch=args.max_batch,
        repeats=args.repeats,
        progress=not args.json and sys.stderr.isatty(),
        attention_backend=args.attention_backend,
        compile=args.compile,
        blocks=_block_counts(args.blocks),
        text_tokens=args.text_tokens,
        engine_only=args.engine_only,
    )
    if args.json:
        print(json.dumps(result))
    elif args.engine_only:
        print(format_engine_only(result))
    else:
        s = result["settings"]
        m = s["model"]
        print(
            f"G²RPO rollout, T={s['num_steps']} G={s['group_size']} k={s['sde_steps']} "
            f"g={s['granularities']} terminal={s['terminal']} prompts={s['num_prompts']}\n"
            f"model: {m['class']} ({m['preset']}) {m['parameters']:,} params, "
            f"{m['image_tokens']} image tokens, {m['dtype']} on {s['device']}\n"
            f"  batched  : {result['wall_batched_s']:.3f} s, {result['nfe_batched']} NFEs "
            f"(expected {result['nfe_expected']}, unshared {result['nfe_unshared']}) "
            f"in {result['model_calls_batched']} calls\n"
            f"  reference: {result['wall_reference_s']:.3f} s, {result['nfe_reference']} NFEs\n"
            f"  speedup {result['speedup']:.2f}x, parity max |Δ| {result['parity_max_abs']:.2e}\n"
            f"  {result['flops_per_nfe'] / 1e9:.3f} GFLOP per NFE; engine "
            f"{result['engine']['tflops']:.3f} TFLOP/s, raw forward at batch "
            f"{result['raw_forward']['batch']} {result['raw_forward']['tflops']:.3f} TFLOP/s: "
            f"engine = {result['engine_vs_raw_forward']:.0%} of the raw forward"
            + (f", MFU {result['engine']['mfu']:.1%}" if result["engine"]["mfu"] else "")
        )
        if result["compiled"] is not None:
            print(format_compiled(result["compiled"]))
    return 0


def _block_counts(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    counts = int_list(text)
    if len(counts) != 2 or min(counts) < 1:
        raise UsageError(f"--blocks takes DOUBLE,SINGLE block counts >= 1 (e.g. 19,38), got {text}")
    return counts[0], counts[1]


def add_engine_parser(bench_sub) -> None:
    eng = bench_sub.add_parser(
        "engine", help="batched tree engine vs the official-order reference loop"
    )
    eng.add_argument("--quick", action="store_true", help="one prompt, one repeat")
    eng.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    eng.add_argument("--json", action="store_true", help="print one JSON object")
    eng.add_argument(
        "--size",
        choices=["test", "bench", "gpu", "flux"],
        default=None,
        help="model preset (default: bench on cpu, gpu on cuda)",
    )
    eng.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    eng.add_argument(
        "--latent-size",
        type=int,
        default=None,
        help="latent height=width; tokens = (size/2)^2 (default 8 on cpu, 64 on cuda)",
    )
    eng.add_argument("--steps", type=int, default=16)
    eng.add_argument("--group-size", type=int, default=12)
    eng.add_argument("--sde-steps", type=int_list, default=None, help="e.g. 0,1,2,3")
    eng.add_argument("--granularities", type=int_list, default=None, help="e.g. 1,2")
    eng.add_argument("--terminal", choices=["exact", "reference"], default="exact")
    eng.add_argument("--prompts", type=int, default=None)
    eng.add_argument("--max-batch", type=int, default=256)
    eng.add_argument("--repeats", type=int, default=None)
    eng.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    eng.add_argument(
        "--attention-backend",
        choices=["auto", "flash", "efficient", "cudnn", "math", "fastest"],
        default="auto",
        help="SDPA kernels (model.attention_backend); fastest: each kernel timed at the "
        "first attention shape, as model.rollout_attention_backend fastest does",
    )
    eng.add_argument(
        "--compile",
        choices=["none", "blocks", "blocks_cuda_graphs"],
        default="none",
        help="then the batched engine again with the transformer's repeated blocks compiled "
        "(model.compile), against the eager run: its first run (the compile) and steady time",
    )
    eng.add_argument(
        "--blocks",
        default=None,
        metavar="DOUBLE,SINGLE",
        help="block counts instead of the preset's (FLUX.1-dev: --size flux --blocks 19,38)",
    )
    eng.add_argument(
        "--text-tokens", type=int, default=8, help="prompt tokens (FLUX.1-dev's T5: 512)"
    )
    eng.add_argument(
        "--engine-only",
        action="store_true",
        help="the batched engine alone: no reference loop, no bare-forward ceiling (FLOPs "
        "counted on one sample's forward); how FLUX.1-dev's depth fits a GPU stage",
    )
    eng.set_defaults(func=_cmd_bench_engine)
