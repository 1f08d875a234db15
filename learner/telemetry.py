"""Training telemetry beyond metrics.jsonl: Prometheus gauges served by the driver, and
the run's live status in Redis (a key and a stream) for ``g2rpo status``."""

from __future__ import annotations

import json
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from ..common.errors import RunDirError, UsageError

STATUS_KEY = "g2rpo:runs:{name}"
STREAM_KEY = "g2rpo:runs:{name}:metrics"


class TrainingExporter:
    """Prometheus metrics of the running job (names per DESIGN §3: g2rpo_ prefix, base units)."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        r = self.registry = CollectorRegistry()
        self.iteration = Gauge("g2rpo_train_iteration", "Last finished iteration", registry=r)
        self.version = Gauge("g2rpo_train_weight_version", "Weights version trained", registry=r)
        self.reward = Gauge("g2rpo_train_reward", "Mean branch reward", ["reward"], registry=r)
        self.eval_reward = Gauge(
            "g2rpo_train_eval_reward", "Held-out anchor reward", ["reward"], registry=r
        )
        self.loss = Gauge("g2rpo_train_loss", "PPO-clip loss", registry=r)
        self.grad_norm = Gauge("g2rpo_train_grad_norm", "Pre-clip gradient norm", registry=r)
        self.clip_fraction = Gauge("g2rpo_train_clip_fraction", "Clipped ratios", registry=r)
        self.ratio = Gauge("g2rpo_train_ratio", "PPO ratio", ["stat"], registry=r)
        self.nfe = Counter("g2rpo_train_model_evaluations_total", "Sample evaluations", registry=r)
        self.phase = Gauge(
            "g2rpo_train_phase_seconds",
            "Wall time of the last iteration's phase",
            ["phase"],
            registry=r,
        )
        self.reward_by_granularity = Gauge(
            "g2rpo_train_reward_by_granularity",
            "Mean branch reward at one ODE granularity",
            ["reward", "granularity"],
            registry=r,
        )
        self.advantage = Gauge(
            "g2rpo_train_advantage", "Fused advantage statistics", ["stat"], registry=r
        )
        self.advantage_share = Gauge(
            "g2rpo_train_advantage_share",
            "Each reward's share of the advantage's magnitude",
            ["reward"],
            registry=r,
        )
        self.last_iteration = Gauge(
            "g2rpo_train_last_iteration_timestamp_seconds",
            "Unix time the last iteration finished",
            registry=r,
        )
        self.weight_lag = Gauge(
            "g2rpo_train_weight_lag",
            "Versions between the weights that sampled the last batch and those it updated",
            registry=r,
        )
        self.broadcast_failures = Counter(
            "g2rpo_train_weight_broadcast_failures_total",
            "Weight broadcasts that failed (those versions went through the object store)",
            registry=r,
        )
        self._failures_seen = 0
        self.server, self.thread = start_http_server(port, addr=host, registry=r)
        self.port = self.server.server_port

    def observe(self, row: dict) -> None:
        self.iteration.set(row["iteration"])
        self.version.set(row["version"])
        self.last_iteration.set(time.time())
        for key, value in row.items():
            if key.startswith("reward/") and key.count("/") == 1:
                self.reward.labels(key.split("/", 1)[1]).set(value)
            elif key.startswith("reward/") and key.rsplit("/", 1)[1].startswith("g"):
                name, g = key[len("reward/") :].rsplit("/", 1)
                self.reward_by_granularity.labels(name, g[1:]).set(value)
            elif key.startswith("adv_share/"):
                self.advantage_share.labels(key.split("/", 1)[1]).set(value)
            elif key.startswith("eval/") and (key.count("/") == 1 or key.endswith("/pass")):
                self.eval_reward.labels(key.split("/", 1)[1]).set(value)
            elif key.startswith("time/"):
                self.phase.labels(key[5:].removesuffix("_s")).set(value)
        self.loss.set(row["loss"])
        self.grad_norm.set(row["grad_norm"])
        self.clip_fraction.set(row["clip_fraction"])
        for stat in ("mean", "min", "max"):
            self.ratio.labels(stat).set(row[f"ratio_{stat}"])
        for stat in ("abs_mean", "std", "clipped_frac"):
            if f"adv_{stat}" in row:
                self.advantage.labels(stat).set(row[f"adv_{stat}"])
        self.nfe.inc(row["nfe"])
        self.weight_lag.set(row.get("weight_lag", 0))
        failures = row.get("weight_broadcast_failures", 0)  # cumulative in the row
        self.broadcast_failures.inc(max(0, failures - self._failures_seen))
        self._failures_seen = max(failures, self._failures_seen)

    def close(self) -> None:
        self.server.shutdown()


class RedisStatus:
    """Publishes each iteration's row under the run's key and appends it to a stream."""

    def __init__(self, redis_url: str, name: str) -> None:
        import redis

        self.client = redis.Redis.from_url(redis_url, socket_timeout=2.0)
        self.key, self.stream = STATUS_KEY.format(name=name), STREAM_KEY.format(name=name)

    def publish(self, row: dict, run_dir: Path, state: str = "running") -> None:
        payload = json.dumps(
            {"state": state, "run_dir": str(run_dir), "updated": time.time(), "last": row}
        )
        self.client.set(self.key, payload)
        self.client.xadd(self.stream, {"row": json.dumps(row)}, maxlen=100_000)


def read_status(run: str | None, redis_url: str | None) -> dict:
    """The live state of a run, from Redis when given, else from its run directory."""
    if redis_url:
        import redis

        client = redis.Redis.from_url(redis_url, socket_timeout=2.0)
        if run is None:
            keys = sorted(
                k.decode()
                for k in client.scan_iter(match="g2rpo:runs:*")
                if not k.decode().endswith(":metrics")
            )
            return {"runs": [k.split(":", 2)[2] for k in keys]}
        raw = client.get(STATUS_KEY.format(name=run))
        if raw is None:
            raise RunDirError(f"no run {run!r} in {redis_url}")
        status = json.loads(raw)
        status["iterations_in_stream"] = client.xlen(STREAM_KEY.format(name=run))
        return status
    if run is None:
        raise UsageError("give a run directory (e.g. runs/tiny) or --redis-url")
    run_dir = Path(run)
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise RunDirError(f"{run_dir}: no metrics.jsonl (not a run directory, or not started)")
    rows = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()]
    from .run_files import list_checkpoints

    ckpts = [p.name for p in list_checkpoints(run_dir)]
    actors = run_dir / "actors.json"
    return {
        "run_dir": str(run_dir),
        "iterations": len(rows),
        "last": rows[-1] if rows else None,
        "checkpoints": ckpts,
        "actors": json.loads(actors.read_text()) if actors.exists() else None,
    }
