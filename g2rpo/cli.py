"""The ``g2rpo`` command: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import json
import sys

from g2rpo import __version__


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _cmd_bench_engine(args: argparse.Namespace) -> int:
    import torch

    from g2rpo.rollout_worker.bench import bench_engine

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
    )
    if args.json:
        print(json.dumps(result))
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
            f"  speedup {result['speedup']:.2f}x, parity max |Δ| {result['parity_max_abs']:.2e}"
        )
    return 0


def _cmd_bench_reward(args: argparse.Namespace) -> int:
    from g2rpo.reward_server.bench import bench_reward

    result = bench_reward(
        scorer=args.scorer, duration_s=args.duration, per_request=args.images_per_request
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


def _cmd_train(args: argparse.Namespace) -> int:
    import os

    if not os.environ.get("RAY_ADDRESS"):  # before ray is imported: a local cluster, no token
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from g2rpo.learner.driver import read_metrics, train

    if args.config is None and args.resume is None:
        raise ValueError("give --config FILE (e.g. configs/tiny.yaml) or --resume RUN_DIR")
    try:
        run_dir = train(
            args.config,
            args.set,
            resume=args.resume,
            redis_url=args.redis_url,
            progress=not args.no_progress,
            max_iterations=args.max_iterations,
        )
    except KeyboardInterrupt:
        return 130
    rows = read_metrics(run_dir)
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    print(f"run {run_dir}: {len(rows)} iterations in metrics.jsonl")
    if evals:
        keys = [k for k in evals[0] if k.startswith("eval/")]
        for k in keys:
            print(
                f"  {k}: {evals[0][k]:.4f} (it {evals[0]['iteration']}) -> "
                f"{evals[-1][k]:.4f} (it {evals[-1]['iteration']})"
            )
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from g2rpo.learner.telemetry import read_status

    state = read_status(args.run, args.redis_url)
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
    from g2rpo.common.config import dump_config, load_config

    cfg = load_config(args.config, args.set)
    print(dump_config(cfg), end="")
    return 0


def _cmd_pretrain(args: argparse.Namespace) -> int:
    import torch

    from g2rpo.world.pretrain import pretrain

    if args.threads:
        torch.set_num_threads(args.threads)
    meta = pretrain(args.out, quick=args.quick, seed=args.seed, progress=not args.no_progress)
    t = meta["timings"]
    print(
        f"wrote {args.out}/pipeline (FluxPipeline layout) and {args.out}/shapes_clip in "
        f"{t['total_s']:.0f} s (vae {t['vae_s']:.0f} s, flow {t['flow_s']:.0f} s, "
        f"shapes_clip {t['shapes_clip_s']:.0f} s); final flow loss {meta['flow_loss_ema']:.4f}"
    )
    return 0


def _cmd_eval_world(args: argparse.Namespace) -> int:
    from g2rpo.world import DEFAULT_WORLD
    from g2rpo.world.evaluate import evaluate_world

    world = args.world or DEFAULT_WORLD
    report = evaluate_world(
        world, samples_per_prompt=args.samples_per_prompt, seed=args.seed, grid_path=args.grid
    )
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"world: {world}")
    for split in ("held_out", "train"):
        r = report[split]
        c = r["checker"]
        print(
            f"  {split:8s} {r['samples']} samples of {r['prompts']} prompts: checker pass "
            f"{c['pass']:.1%} (bg {c['bg']:.1%}, fg {c['fg']:.1%}, shape {c['shape']:.1%}), "
            f"shapes_clip {r['shapes_clip_mean']:.3f}"
        )
    print(
        f"  shapes_clip AUC correct vs mismatched (held-out ground truth): "
        f"{report['shapes_clip_auc']:.3f} ({report['shapes_clip_gt_mean']:.3f} vs "
        f"{report['shapes_clip_mismatched_mean']:.3f})"
    )
    if args.grid:
        print(f"  sample grid: {args.grid}")
    return 0


def _cmd_embed_prompts(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from g2rpo.common.flux_pipeline import FluxComponents, save_prompt_embeddings

    text = Path(args.prompts).read_text(encoding="utf-8")
    prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"--prompts {args.prompts}: no prompts in the file")
    comps = FluxComponents.load(args.pipeline)
    with torch.no_grad():
        embeds = comps.encode_prompts(prompts, args.max_sequence_length)
    save_prompt_embeddings(args.out, prompts, embeds)
    shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in embeds.items())
    print(f"wrote {len(prompts)} prompt embeddings to {args.out} ({shapes})")
    return 0


def _cmd_reward_server(args: argparse.Namespace) -> int:
    import uvicorn

    from g2rpo.reward_server.app import create_app
    from g2rpo.reward_server.settings import ScorerSpec, ServerSettings, token_from_env

    fields = dict(
        scorers=[ScorerSpec.parse(s) for s in args.scorers.split(",") if s.strip()],
        host=args.host,
        port=args.port,
        redis_url=args.redis_url,
        token=token_from_env(args.token_env),
        insecure=args.insecure,
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        advertise_url=args.advertise_url,
        heartbeat_ttl_s=args.heartbeat_ttl,
        device=args.device,
    )
    if args.replica_id:
        fields["replica_id"] = args.replica_id
    settings = ServerSettings(**fields)
    settings.check_bind()
    settings.check_device()
    print(
        f"reward server {settings.replica_id} on {settings.url()} serving "
        f"{', '.join(s.name for s in settings.scorers)}"
        + (f", registered in {settings.redis_url}" if settings.redis_url else ""),
        flush=True,
    )
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="g2rpo", description="Granular-GRPO online RL for flow-matching text-to-image models"
    )
    parser.add_argument("--version", action="version", version=f"g2rpo {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True, metavar="WHAT")
    eng = bench_sub.add_parser(
        "engine", help="batched tree engine vs the official-order reference loop"
    )
    eng.add_argument("--quick", action="store_true", help="one prompt, one repeat")
    eng.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    eng.add_argument("--json", action="store_true", help="print one JSON object")
    eng.add_argument(
        "--size",
        choices=["test", "bench", "gpu"],
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
    eng.add_argument("--sde-steps", type=_int_list, default=None, help="e.g. 0,1,2,3")
    eng.add_argument("--granularities", type=_int_list, default=None, help="e.g. 1,2")
    eng.add_argument("--terminal", choices=["exact", "reference"], default="exact")
    eng.add_argument("--prompts", type=int, default=None)
    eng.add_argument("--max-batch", type=int, default=256)
    eng.add_argument("--repeats", type=int, default=None)
    eng.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    eng.set_defaults(func=_cmd_bench_engine)

    pre = sub.add_parser(
        "pretrain", help="train the tiny offline shapes world (pipeline + shapes_clip reward)"
    )
    pre.add_argument("--out", required=True, help="output directory (must not hold a pipeline)")
    pre.add_argument("--quick", action="store_true", help="a tiny run for tests (~1 minute)")
    pre.add_argument("--seed", type=int, default=0)
    pre.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    pre.add_argument("--no-progress", action="store_true", help="hide progress bars")
    pre.set_defaults(func=_cmd_pretrain)

    ev = sub.add_parser("eval", help="evaluations")
    ev_sub = ev.add_subparsers(dest="eval", required=True, metavar="WHAT")
    ew = ev_sub.add_parser(
        "world", help="base model checker pass rate, shapes_clip AUC and a sample grid"
    )
    ew.add_argument("--world", default=None, help="world dir (default: the committed one)")
    ew.add_argument("--samples-per-prompt", type=int, default=5)
    ew.add_argument("--seed", type=int, default=0)
    ew.add_argument("--grid", default=None, help="write a sample grid PNG here")
    ew.add_argument("--json", action="store_true")
    ew.set_defaults(func=_cmd_eval_world)

    emb = sub.add_parser(
        "embed-prompts", help="precompute prompt embeddings into a safetensors cache"
    )
    emb.add_argument("--pipeline", required=True, help="local FluxPipeline directory")
    emb.add_argument("--prompts", required=True, help="text file, one prompt per line")
    emb.add_argument("--out", required=True, help="output .safetensors file")
    emb.add_argument("--max-sequence-length", type=int, default=512)
    emb.set_defaults(func=_cmd_embed_prompts)

    rs = sub.add_parser("reward-server", help="serve scorers over HTTP (FastAPI)")
    rs.add_argument("--scorers", required=True, help="NAME[=LOCAL_DIR][,NAME...]")
    rs.add_argument("--host", default="127.0.0.1")
    rs.add_argument("--port", type=int, default=8300)
    rs.add_argument("--redis-url", default=None, help="register for discovery and share a cache")
    rs.add_argument("--token-env", default=None, help="env var holding the bearer token")
    rs.add_argument("--insecure", action="store_true", help="allow a public bind without token")
    rs.add_argument("--device", default="cpu", help="where model scorers run: cpu, cuda, cuda:1")
    rs.add_argument("--max-batch", type=int, default=64, help="images per scorer call")
    rs.add_argument("--max-wait-ms", type=float, default=5.0, help="batching window")
    rs.add_argument("--heartbeat-ttl", type=float, default=6.0, help="registration TTL (s)")
    rs.add_argument("--replica-id", default=None)
    rs.add_argument("--advertise-url", default=None, help="URL clients should use")
    rs.set_defaults(func=_cmd_reward_server)

    rb = bench_sub.add_parser("reward", help="reward-server throughput and latency")
    rb.add_argument("--json", action="store_true")
    rb.add_argument("--scorer", default="shapes_clip")
    rb.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    rb.add_argument(
        "--images-per-request",
        type=int,
        default=32,
        help="images per request (a rollout worker sends G·K·|granularities| per prompt: 192 "
        "in the paper's setting)",
    )
    rb.set_defaults(func=_cmd_bench_reward)

    tr = sub.add_parser("train", help="run G²RPO (or a baseline) on Ray")
    tr.add_argument("--config", default=None, help="YAML config (e.g. configs/tiny.yaml)")
    tr.add_argument("--set", action="append", default=[], metavar="a.b=c")
    tr.add_argument("--resume", default=None, help="continue runs/<name> from its checkpoint")
    tr.add_argument("--redis-url", default=None, help="find reward servers in this Redis")
    tr.add_argument("--max-iterations", type=int, default=None, help="stop after this many")
    tr.add_argument("--no-progress", action="store_true")
    tr.set_defaults(func=_cmd_train)

    st = sub.add_parser("status", help="live state of a training run")
    st.add_argument("run", nargs="?", default=None, help="run directory or run name (Redis)")
    st.add_argument("--redis-url", default=None)
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


def main(argv: list[str] | None = None) -> int:
    from pydantic import ValidationError

    from g2rpo.common.config import ConfigError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, ValueError, RuntimeError, OSError, ValidationError) as exc:
        print(f"g2rpo: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("g2rpo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
