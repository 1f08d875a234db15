"""``g2rpo convert-reward``: published reward checkpoints → from_pretrained directories."""

from __future__ import annotations

import argparse
import json


def _cmd_convert_reward(args: argparse.Namespace) -> int:
    from g2rpo.reward_server.convert import convert_reward

    record = convert_reward(
        args.kind,
        args.src,
        args.out,
        tokenizer=args.tokenizer,
        openclip_config=args.openclip_config,
        head_width=args.vision_head_width,
    )
    if args.json:
        print(json.dumps(record))
    else:
        print(
            f"wrote {args.out}: {args.kind} from {record['source']} "
            f"({record['source_tensors']} tensors, sha256 {record['source_sha256'][:12]}); "
            f"serve it with `g2rpo reward-server --scorers "
            f"{'clip_score' if args.kind in ('dfn5b_clip', 'openclip') else args.kind}={args.out}`"
        )
    return 0


def _server_settings(args: argparse.Namespace):
    """ServerSettings from the arguments reward-server and reward-serve share."""
    from g2rpo.common.cluster.redis_access import FLAG, redis_password
    from g2rpo.common.errors import UsageError
    from g2rpo.reward_server.settings import ScorerSpec, ServerSettings, mib_bytes, token_from_env

    if mib_bytes(args.max_payload_mib) < 1024:
        raise UsageError(f"--max-payload-mib {args.max_payload_mib:g}: at least 0.001 (1 KiB)")
    fields = dict(
        scorers=[ScorerSpec.parse(s) for s in args.scorers.split(",") if s.strip()],
        host=args.host,
        port=args.port,
        redis_url=args.redis_url,
        redis_password=redis_password(args.redis_password_env, FLAG),
        token=token_from_env(args.token_env),
        tls_cert_file=args.tls_cert,
        tls_key_file=args.tls_key,
        insecure=args.insecure,
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        max_payload_bytes=mib_bytes(args.max_payload_mib),
        advertise_url=args.advertise_url,
        heartbeat_ttl_s=args.heartbeat_ttl,
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
    )
    if getattr(args, "replica_id", None):
        fields["replica_id"] = args.replica_id
    settings = ServerSettings(**fields)
    settings.check_scorers()
    settings.check_bind()
    settings.check_tls()
    settings.check_redis()  # a refused Redis password is one line here, not a failed start
    return settings


def _cmd_reward_server(args: argparse.Namespace) -> int:
    import uvicorn
    from g2rpo.reward_server.app import create_app

    settings = _server_settings(args)
    settings.check_device()
    print(
        f"reward server {settings.replica_id} on {settings.url()} serving "
        f"{', '.join(s.name for s in settings.scorers)}"
        + (f", registered in {settings.redis_url}" if settings.redis_url else ""),
        flush=True,
    )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        **settings.uvicorn_tls(),
    )
    return 0


def _cmd_reward_serve(args: argparse.Namespace) -> int:
    import os

    from g2rpo.reward_server.serve import ServeOptions, serve_rewards

    settings = _server_settings(args)
    options = ServeOptions(
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
        target_ongoing_requests=args.target_ongoing_requests,
        num_cpus=args.num_cpus,
        num_gpus=args.num_gpus,
    )
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    print(
        f"reward servers on Ray Serve at {settings.scheme}://{settings.host}:{settings.port} "
        f"({options.min_replicas}-{options.max_replicas} replicas)",
        flush=True,
    )
    serve_rewards(settings, options, settings.port)
    return 0


def _server_arguments(p: argparse.ArgumentParser, port: int) -> None:
    p.add_argument("--scorers", required=True, help="NAME[=LOCAL_DIR][,NAME...]")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=port)
    p.add_argument("--redis-url", default=None, help="register for discovery and share a cache")
    p.add_argument(
        "--redis-password-env",
        default=None,
        metavar="VAR",
        help="env var holding the Redis password (never put it in --redis-url)",
    )
    p.add_argument(
        "--token-env",
        default=None,
        help="env var holding the bearer token (32 bytes or more: `openssl rand -hex 32`)",
    )
    p.add_argument("--tls-cert", default=None, metavar="FILE", help="serve HTTPS: certificate")
    p.add_argument("--tls-key", default=None, metavar="FILE", help="the certificate's key")
    p.add_argument("--insecure", action="store_true", help="allow a public bind without token")
    p.add_argument("--device", default="cpu", help="where model scorers run: cpu, cuda, cuda:1")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="model scorers' weights (auto: bfloat16 on CUDA, float32 on CPU)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads for scoring (default: torch's, from OMP_NUM_THREADS); a "
        "score's last bits depend on it",
    )
    p.add_argument("--max-batch", type=int, default=64, help="images per scorer call")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="batching window")
    p.add_argument(
        "--max-payload-mib",
        type=float,
        default=64.0,
        help="refuse (413) request bodies over this many MiB; clients split their batches "
        "to fit (train.reward.request_mib is what a run's workers send at most)",
    )
    p.add_argument("--heartbeat-ttl", type=float, default=6.0, help="registration TTL (s)")
    p.add_argument("--advertise-url", default=None, help="URL clients should use")


def add_reward_parsers(sub) -> None:
    from g2rpo.reward_server.convert import KINDS

    cv = sub.add_parser(
        "convert-reward",
        help="convert a published reward checkpoint (HPS-v2.1, DFN5B-CLIP, ImageReward) once",
        description=(
            "Map an original checkpoint's tensors into transformers modules and write a "
            "directory the reward server loads with from_pretrained. Every tensor is "
            "accounted for: a missing or mis-shaped one refuses the checkpoint."
        ),
    )
    cv.add_argument("kind", choices=KINDS)
    cv.add_argument(
        "src", help="HPS_v2.1_compressed.pt, open_clip_pytorch_model.bin, ImageReward.pt"
    )
    cv.add_argument("out", help="directory to write")
    cv.add_argument(
        "--tokenizer",
        required=True,
        help="CLIP kinds: a CLIP tokenizer directory or open_clip's bpe_simple_vocab_16e6.txt.gz; "
        "image_reward: a bert-base-uncased tokenizer directory",
    )
    cv.add_argument(
        "--openclip-config",
        default=None,
        help="the model's open_clip_config.json (heads, QuickGELU, mean/std); needed for openclip",
    )
    cv.add_argument(
        "--vision-head-width", type=int, default=None, help="override the preset's head width"
    )
    cv.add_argument("--json", action="store_true", help="print conversion.json's record")
    cv.set_defaults(func=_cmd_convert_reward)

    server = sub.add_parser("reward-server", help="serve scorers over HTTP (FastAPI)")
    _server_arguments(server, 8300)
    server.add_argument("--replica-id", default=None)
    server.set_defaults(func=_cmd_reward_server)

    serve = sub.add_parser(
        "reward-serve",
        help="reward servers as an autoscaled Ray Serve deployment (on RAY_ADDRESS's cluster)",
    )
    _server_arguments(serve, 8000)  # --host/--port: Serve's HTTP proxy
    serve.add_argument("--min-replicas", type=int, default=1)
    serve.add_argument("--max-replicas", type=int, default=4)
    serve.add_argument("--target-ongoing-requests", type=float, default=2.0)
    serve.add_argument("--num-cpus", type=float, default=1.0, help="per replica")
    serve.add_argument("--num-gpus", type=float, default=0.0, help="per replica")
    serve.set_defaults(func=_cmd_reward_serve)
