"""The ``g2rpo`` command: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import json
import sys

from g2rpo import __version__
from g2rpo.cli_bench import add_bench_parsers
from g2rpo.cli_evidence import add_evidence_parsers
from g2rpo.cli_guard import add_guard_parsers
from g2rpo.cli_hacking import add_hacking_parsers
from g2rpo.cli_plan import add_doctor_parser, add_plan_parsers
from g2rpo.cli_rehearse import add_rehearse_parser
from g2rpo.cli_reward import add_reward_parsers
from g2rpo.common.errors import UsageError


def _cmd_train(args: argparse.Namespace) -> int:
    import os

    if not os.environ.get("RAY_ADDRESS"):  # before ray is imported: a local cluster, no token
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if args.config is None and args.resume is None:
        raise UsageError("give --config FILE (e.g. configs/tiny.yaml) or --resume RUN_DIR")
    if args.resume_or_start and (args.config is None or args.resume is not None):
        raise UsageError("--resume-or-start goes with --config FILE (and without --resume)")
    if args.redis_password_env:  # the variable's name only: its value never reaches a file
        from g2rpo.common.cluster.redis_access import FLAG, redis_password

        redis_password(args.redis_password_env, FLAG)  # unset: said before Ray starts
        args.set = [*args.set, f"train.reward.redis_password_env={args.redis_password_env}"]
    resume = args.resume
    if resume is None:  # a bad config says so before Ray and torch load
        from g2rpo.common.config.loading import load_config

        load_config(args.config, args.set)
    if args.resume_or_start:
        from g2rpo.orchestration.lifecycle import run_to_continue

        resume = run_to_continue(args.config, args.set)
    from g2rpo.common.cluster.stopping import interrupted_exit_code, sigterm_as_interrupt
    from g2rpo.orchestration.driver import read_metrics, train

    try:
        with sigterm_as_interrupt():  # `ray job stop`, `kill`: checkpoint, as Ctrl-C does
            run_dir = train(
                args.config,
                args.set,
                resume=resume,
                redis_url=args.redis_url,
                progress=not args.no_progress,
                max_iterations=args.max_iterations,
            )
    except KeyboardInterrupt as exc:
        return interrupted_exit_code(exc)
    from g2rpo.run_directory.eval_rows import evaluation_change
    from g2rpo.run_directory.files import read_evaluations

    print(f"run {run_dir}: {len(read_metrics(run_dir))} iterations in metrics.jsonl")
    evals = read_evaluations(run_dir)  # the last: the trained weights' own, at the end
    if evals:
        first, last = evals[0], evals[-1]
        change = evaluation_change(first, last)
        for name, before in first["scores"].items():
            if f"eval/{name}" not in change:
                continue
            line = (
                f"  eval/{name}: {sum(before) / len(before):.4f} (it {first['iteration']}) -> "
                f"{change[f'eval/{name}']:.4f} (it {last['iteration']})"
            )
            if last is not first and f"eval/{name}/delta" in change:
                line += (
                    f", paired change {change[f'eval/{name}/delta']:+.4f} "
                    f"[{change[f'eval/{name}/delta_lo']:+.4f}, "
                    f"{change[f'eval/{name}/delta_hi']:+.4f}] (95% CI)"
                )
            print(line)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from g2rpo.common.cluster.redis_access import FLAG, redis_password
    from g2rpo.orchestration.telemetry import read_status

    state = read_status(args.run, args.redis_url, redis_password(args.redis_password_env, FLAG))
    if "redis_error" in state:
        print(
            f"g2rpo status: Redis did not answer ({state['redis_error']}); "
            "read from the run directory",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(state))
        return 0
    if "runs" in state:
        print("runs in Redis: " + (", ".join(state["runs"]) or "none"))
        return 0
    last = state.get("last") or {}
    where = state.get("run_dir", args.run)
    print(
        f"run {where}: state {state.get('state', 'on disk')}, "
        f"{state.get('iterations', state.get('iterations_in_stream', 0))} iterations"
    )
    if last:
        rewards = ", ".join(
            f"{k} {v:.4f}"
            for k, v in last.items()
            if k.startswith(("reward/", "eval/")) and k.count("/") == 1
        )
        print(
            f"  last iteration {last['iteration']} (weights v{last['version']}): {rewards}; "
            f"loss {last['loss']:.3e}, clip {last['clip_fraction']:.2f}, "
            f"{last['time/iteration_s']:.1f} s/iteration"
        )
    if state.get("checkpoints"):
        print(f"  latest checkpoint {state['checkpoints'][-1]}")
    return 0


def _cmd_config_show(args: argparse.Namespace) -> int:
    from g2rpo.common.config.loading import dump_config, load_config

    cfg = load_config(args.config, args.set)
    print(dump_config(cfg), end="")
    return 0


def _cmd_pretrain(args: argparse.Namespace) -> int:
    from pathlib import Path

    existing = Path(args.out) / "pipeline"
    if existing.exists():  # said before torch loads (pretrain itself checks it too)
        raise UsageError(f"{existing} already exists; choose another --out")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.family != "flux":
        from g2rpo.world.family_world import pretrain_family

        meta = pretrain_family(
            args.out, args.family, quick=args.quick, seed=args.seed, progress=not args.no_progress
        )
        print(
            f"wrote {args.out}/pipeline ({args.family} layout) and {args.out}/shapes_clip in "
            f"{sum(meta['timings'].values()):.0f} s; final flow loss {meta['flow_loss_ema']:.4f}"
        )
        return 0
    from g2rpo.world.pretrain import pretrain

    meta = pretrain(args.out, quick=args.quick, seed=args.seed, progress=not args.no_progress)
    t = meta["timings"]
    print(
        f"wrote {args.out}/pipeline (FluxPipeline layout) and {args.out}/shapes_clip in "
        f"{t['total_s']:.0f} s (vae {t['vae_s']:.0f} s, flow {t['flow_s']:.0f} s, "
        f"shapes_clip {t['shapes_clip_s']:.0f} s); final flow loss {meta['flow_loss_ema']:.4f}"
    )
    return 0


def _cmd_embed_prompts(args: argparse.Namespace) -> int:
    from pathlib import Path

    from g2rpo.common.families.loaders import resolve_local_dir

    text = Path(args.prompts).read_text(encoding="utf-8")
    prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise UsageError(f"--prompts {args.prompts}: no prompts in the file")
    # a wrong path says so before torch and diffusers load (seconds)
    resolve_local_dir(args.pipeline, "FLUX pipeline", required=("model_index.json",))
    import torch
    from g2rpo.common.families.flux_pipeline import FluxComponents, save_prompt_embeddings

    comps = FluxComponents.load(args.pipeline)
    with torch.no_grad():
        embeds = comps.encode_prompts(prompts, args.max_sequence_length)
    save_prompt_embeddings(args.out, prompts, embeds)
    shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in embeds.items())
    print(f"wrote {len(prompts)} prompt embeddings to {args.out} ({shapes})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="g2rpo", description="Granular-GRPO online RL for flow-matching text-to-image models"
    )
    parser.add_argument("--version", action="version", version=f"g2rpo {__version__}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="(before the command) show an error's traceback instead of its one-line message",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    add_bench_parsers(sub)
    add_reward_parsers(sub)

    pre = sub.add_parser(
        "pretrain", help="train the tiny offline shapes world (pipeline + shapes_clip reward)"
    )
    pre.add_argument("--out", required=True, help="output directory (must not hold a pipeline)")
    pre.add_argument(
        "--quick",
        action="store_true",
        help="a test-sized world in about 20 s (the layout, not the quality)",
    )
    pre.add_argument("--seed", type=int, default=0)
    pre.add_argument(
        "--family",
        choices=("flux", "sd3", "qwenimage"),
        default="flux",
        help="the pipeline layout: flux (the whole world, VAE and reward included), sd3 "
        "(on the committed FLUX world's VAE) or qwenimage (its own 3-D VAE); the last two "
        "copy the committed world's shapes_clip",
    )
    pre.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    pre.add_argument("--no-progress", action="store_true", help="hide progress bars")
    pre.set_defaults(func=_cmd_pretrain)

    add_evidence_parsers(sub)
    add_plan_parsers(sub)
    add_doctor_parser(sub)
    add_rehearse_parser(sub)
    add_guard_parsers(sub)
    add_hacking_parsers(sub)

    emb = sub.add_parser(
        "embed-prompts", help="precompute prompt embeddings into a safetensors cache"
    )
    emb.add_argument("--pipeline", required=True, help="local FluxPipeline directory")
    emb.add_argument("--prompts", required=True, help="text file, one prompt per line")
    emb.add_argument("--out", required=True, help="output .safetensors file")
    emb.add_argument("--max-sequence-length", type=int, default=512)
    emb.set_defaults(func=_cmd_embed_prompts)

    tr = sub.add_parser("train", help="run G²RPO (or a baseline) on Ray")
    tr.add_argument("--config", default=None, help="YAML config (e.g. configs/tiny.yaml)")
    tr.add_argument("--set", action="append", default=[], metavar="a.b=c")
    tr.add_argument("--resume", default=None, help="continue runs/<name> from its checkpoint")
    tr.add_argument(
        "--resume-or-start",
        action="store_true",
        help="with --config: resume the run if run.output_dir/run.name holds one, else start "
        "it (a retried or re-applied job continues its run instead of refusing it)",
    )
    tr.add_argument("--redis-url", default=None, help="find reward servers in this Redis")
    tr.add_argument(
        "--redis-password-env",
        default=None,
        metavar="VAR",
        help="env var holding that Redis's password (overrides train.reward.redis_password_env)",
    )
    tr.add_argument("--max-iterations", type=int, default=None, help="stop after this many")
    tr.add_argument("--no-progress", action="store_true")
    tr.set_defaults(func=_cmd_train)

    st = sub.add_parser("status", help="live state of a training run")
    st.add_argument("run", nargs="?", default=None, help="run directory or run name (Redis)")
    st.add_argument("--redis-url", default=None)
    st.add_argument(
        "--redis-password-env", default=None, metavar="VAR", help="env var holding its password"
    )
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_cmd_status)

    config = sub.add_parser("config", help="configuration tools")
    config_sub = config.add_subparsers(dest="config_cmd", required=True, metavar="WHAT")
    show = config_sub.add_parser("show", help="print the resolved configuration")
    show.add_argument("--config", default=None, help="YAML file (default: built-in defaults)")
    show.add_argument(
        "--set", action="append", default=[], metavar="a.b=c", help="override a field (repeatable)"
    )
    show.set_defaults(func=_cmd_config_show)
    return parser


EXIT_ERROR = 2  # a problem the user can fix, told in one line (argparse's code too)


def user_error(exc: BaseException) -> BaseException | None:
    """The problem a user can fix that ``exc`` is, or carries from a Ray actor
    (``RayTaskError.cause``): the project's own errors, a pydantic ValidationError of
    a settings model, a file a command was given that is not there. None: a bug."""
    from g2rpo.common.errors import G2RPOError
    from pydantic import ValidationError

    kinds = (G2RPOError, ValidationError, FileNotFoundError)
    cause = getattr(exc, "cause", None)
    if isinstance(cause, kinds):
        return cause
    return exc if isinstance(exc, kinds) else None


def error_message(exc: BaseException) -> str:
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        fields = [
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()
        ]
        return f"invalid {exc.title}: " + "; ".join(fields)
    return str(exc)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("g2rpo: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        problem = user_error(exc)
        if problem is None or args.debug:
            raise  # a bug (or --debug): the traceback says where
        print(f"g2rpo: error: {error_message(problem)}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
