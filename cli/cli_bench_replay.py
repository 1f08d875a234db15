"""``g2rpo bench replay``: the learner's one-gather replay (every trained SDE step of a
micro-batch in one forward) against the per-step replay, under ``optim.step_mode:
accumulate``, on a CPU FSDP2 group (no Ray)."""

from __future__ import annotations

import argparse
import json

from g2rpo.common.errors import UsageError


def _cmd_bench_replay(args: argparse.Namespace) -> int:
    from g2rpo.benchmarks.replay import bench_replay, format_replay

    try:
        result = bench_replay(
            preset=args.size,
            world=args.world,
            num_prompts=args.prompts,
            num_steps=args.steps,
            group_size=args.group_size,
            sde_steps=args.sde_steps,
            max_batch=args.max_batch,
            latent_size=args.latent_size,
            kl_beta=args.kl_beta,
            repeats=args.repeats,
            threads=args.threads,
            seed=args.seed,
        )
    except ValueError as e:
        raise UsageError(f"g2rpo bench replay: {e}") from None
    print(json.dumps(result) if args.json else format_replay(result))
    return 0


def add_replay_parser(bench_sub) -> None:
    rp = bench_sub.add_parser(
        "replay",
        help="the learner's one-gather replay vs the per-step replay under step_mode "
        "accumulate: forward calls, FSDP2 all-gathers, wall time, loss/gradient agreement",
        description="--world gloo ranks of one FSDP2 group on the CPU (no Ray) replay the "
        "same G²RPO rollout of a random FLUX-layout transformer under optim.step_mode "
        "accumulate twice: each trained SDE step in forwards of its own, and every step's "
        "states stacked in as few forwards as --max-batch (train.learner.max_batch) allows. "
        "Per rank and iteration: forward calls, all-gathers and reduce-scatters as they "
        "dispatch, the best of --repeats updates; and how far the two first updates differ.",
    )
    rp.add_argument("--size", choices=["test", "bench", "gpu"], default="bench")
    rp.add_argument("--world", type=int, default=2, help="learner ranks (processes)")
    rp.add_argument("--prompts", type=int, default=4)
    rp.add_argument("--steps", type=int, default=16, help="sampling steps T")
    rp.add_argument("--group-size", type=int, default=4)
    rp.add_argument(
        "--sde-steps", type=int, nargs="+", default=None, help="trained SDE steps (default 0..7)"
    )
    rp.add_argument(
        "--max-batch", type=int, default=64, help="distinct states per forward (per rank)"
    )
    rp.add_argument("--latent-size", type=int, default=8)
    rp.add_argument(
        "--kl-beta", type=float, default=0.0, help="> 0: a sharded KL reference forwards too"
    )
    rp.add_argument("--repeats", type=int, default=3)
    rp.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    rp.add_argument("--seed", type=int, default=0)
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(func=_cmd_bench_replay)
