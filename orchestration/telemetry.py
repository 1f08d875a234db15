"""Training telemetry beyond metrics.jsonl: Prometheus gauges served by the driver, and
the run's live status in Redis (a key and a stream) for ``g2rpo status``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from ..common.cluster.redis_access import RedisPassword, connect_redis
from ..common.errors import RunDirError, UsageError

STATUS_KEY = "g2rpo:runs:{name}"
STREAM_KEY = "g2rpo:runs:{name}:metrics"
MAXLEN = 100_000  # rows a run's stream keeps
# eval/<reward>/<suffix> row entries (records.eval_row) -> the change gauge's bound label
CHANGE_BOUNDS = {"delta": "mean", "delta_lo": "lo", "delta_hi": "hi"}
_CHANGE_SUFFIXES = tuple(f"/{suffix}" for suffix in CHANGE_BOUNDS)


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
        self.eval_change = Gauge(
            "g2rpo_train_eval_reward_change",
            "Held-out reward's paired change since the run's first evaluation: its mean "
            "and 95% CI bounds (G2rpoRewardCollapse fires on bound hi < 0)",
            ["reward", "bound"],
            registry=r,
        )
        self.health = Gauge(
            "g2rpo_train_eval_health",
            "Image-health measure of the held-out samples (common/health/image_health.py)",
            ["measure"],
            registry=r,
        )
        self.health_change = Gauge(
            "g2rpo_train_eval_health_change",
            "Image-health measure's paired change since the run's first evaluation: its mean "
            "and 95% CI bounds",
            ["measure", "bound"],
            registry=r,
        )
        self.drift_diverging = Gauge(
            "g2rpo_train_eval_drift_diverging",
            "1 when a trained reward rose since the first evaluation (95% CI above 0) while "
            "a held-out reward fell (CI below 0)",
            registry=r,
        )
        self.guard = Gauge(
            "g2rpo_train_guard",
            "train.guard at the last evaluation: rules crossed now (crossed), consecutive "
            "evaluations with any crossed (streak), rules without a signal (missing), 1 "
            "once a rule held at train.guard.patience evaluations in a row (tripped)",
            ["stat"],
            registry=r,
        )
        self.guard_rule = Gauge(
            "g2rpo_train_guard_rule",
            "Each train.guard rule at the last evaluation: crossed 1 or 0, or missing 1 "
            "when the evaluation does not record its signal",
            ["rule", "state"],
            registry=r,
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
            elif key.startswith("eval/health/") or key.startswith("eval/drift/"):
                self._observe_health(key, value)
            elif key in ("guard/crossed", "guard/streak", "guard/missing", "guard/tripped"):
                self.guard.labels(key.split("/", 1)[1]).set(value)
            elif key.startswith(("guard/rule/", "guard/missing/")):
                state, rule = key[len("guard/") :].split("/", 1)
                crossed = state == "rule"  # a signal seen now: the rule is no longer missing
                self.guard_rule.labels(rule, "crossed" if crossed else "missing").set(value)
                self.guard_rule.labels(rule, "missing").set(0 if crossed else value)
            elif key.startswith("eval/") and key.endswith(_CHANGE_SUFFIXES):
                name, suffix = key[len("eval/") :].rsplit("/", 1)
                self.eval_change.labels(name, CHANGE_BOUNDS[suffix]).set(value)
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

    def _observe_health(self, key: str, value: float) -> None:
        name = key[len("eval/") :]
        if name == "drift/diverging":
            self.drift_diverging.set(value)
        elif name.startswith("drift/"):
            return  # a held-out reward's change: g2rpo_train_eval_reward_change has it
        elif name.endswith(_CHANGE_SUFFIXES):
            measure, suffix = name[len("health/") :].rsplit("/", 1)
            self.health_change.labels(measure, CHANGE_BOUNDS[suffix]).set(value)
        else:
            self.health.labels(name[len("health/") :]).set(value)

    def close(self) -> None:
        self.server.shutdown()


class RedisStatus:
    """Publishes each iteration's row under the run's key and appends it to a stream.

    Redis is the control plane only: while it does not answer, the run goes on (its
    rows are in metrics.jsonl, and ``g2rpo status`` reads the run directory) and the
    rows not yet published wait here; they go to the stream, in order and once each,
    when Redis answers again. A Redis that came back without its data (no
    persistence: the deployments' setting) gets the run's whole stream again from
    metrics.jsonl."""

    def __init__(self, redis_url: str, name: str, password: RedisPassword | None = None) -> None:
        self.url = redis_url
        self.client = connect_redis(redis_url, password)
        self.key, self.stream = STATUS_KEY.format(name=name), STREAM_KEY.format(name=name)
        self.backlog: list[dict] = []  # rows not yet in the stream, oldest first
        self.sent = 0  # rows this session put in the stream
        self.failures = 0  # publishes Redis did not answer, in the current outage

    def publish(self, row: dict, run_dir: Path, state: str = "running") -> None:
        import redis

        self.backlog.append(row)
        payload = json.dumps(
            {"state": state, "run_dir": str(run_dir), "updated": time.time(), "last": row}
        )
        try:
            restored = self._restore_if_lost(run_dir)
            while self.backlog:  # a row leaves the backlog once it is in the stream
                self.client.xadd(self.stream, {"row": json.dumps(self.backlog[0])}, maxlen=MAXLEN)
                self.backlog.pop(0)
                self.sent += 1
            self.client.set(self.key, payload)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self.failures += 1
            if self.failures == 1:  # one line per outage
                print(
                    f"run status: Redis at {self.url} did not answer ({exc}); training goes "
                    f"on, its rows are in {run_dir / 'metrics.jsonl'} and are published "
                    "when Redis answers again",
                    file=sys.stderr,
                )
            return
        if self.failures or restored:
            what = "the run's stream rebuilt from metrics.jsonl" if restored else "published"
            print(
                f"run status: Redis answers again; rows up to iteration {row['iteration']} {what}",
                file=sys.stderr,
            )
        self.failures = 0

    def _restore_if_lost(self, run_dir: Path) -> bool:
        """Redis lost the stream (restarted empty): publish every row on disk again."""
        if not self.sent or self.client.xlen(self.stream) >= min(self.sent, MAXLEN):
            return False
        from ..run_directory.files import read_metrics

        self.client.delete(self.stream)
        self.backlog, self.sent = read_metrics(run_dir), 0  # this row is on disk already
        return True


def read_status(
    run: str | None, redis_url: str | None, password: RedisPassword | None = None
) -> dict:
    """The live state of a run, from Redis when given, else from its run directory;
    when Redis does not answer, from the run directory (``run`` a directory, or a
    run name under runs/), saying so under ``redis_error``. A Redis refusing
    ``password`` (or wanting one) is an error (RedisAuthError), not an outage."""
    if redis_url:
        import redis

        try:
            return _redis_status(run, redis_url, password)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            run_dir = _run_dir_of(run)
            if run_dir is None:
                raise RunDirError(
                    f"Redis at {redis_url} did not answer ({exc}); give the run directory "
                    "to read the run's state from its files"
                ) from None
            return {**_disk_status(run_dir), "redis_error": f"{redis_url}: {exc}"}
    if run is None:
        raise UsageError("give a run directory (e.g. runs/tiny) or --redis-url")
    return _disk_status(Path(run))


def _redis_status(run: str | None, redis_url: str, password: RedisPassword | None) -> dict:
    client = connect_redis(redis_url, password, socket_connect_timeout=2.0)
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


def _run_dir_of(run: str | None) -> Path | None:
    """``run`` as a run directory: a path, or a run name under the default runs/."""
    if run is None:
        return None
    for candidate in (Path(run), Path("runs") / run):
        if (candidate / "metrics.jsonl").is_file():
            return candidate
    return None


def _disk_status(run_dir: Path) -> dict:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise RunDirError(f"{run_dir}: no metrics.jsonl (not a run directory, or not started)")
    rows = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()]
    from ..run_directory.files import list_checkpoints

    ckpts = [p.name for p in list_checkpoints(run_dir)]
    actors = run_dir / "actors.json"
    return {
        "run_dir": str(run_dir),
        "iterations": len(rows),
        "last": rows[-1] if rows else None,
        "checkpoints": ckpts,
        "actors": json.loads(actors.read_text()) if actors.exists() else None,
    }
