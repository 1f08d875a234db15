"""Where a run's rewards come from: static replica URLs, replicas discovered in
Redis, and replicas the job starts itself as Ray actors placed by resources
(each one a ``g2rpo reward-server`` process on its actor's node)."""

from __future__ import annotations

import os
import secrets
import sys
import threading

import ray

from ..common.config import G2RPOConfig
from ..common.errors import ConfigError, RunFailed
from ..common.messages import RewardEndpoints

TOKEN_VAR = "G2RPO_REWARD_TOKEN"


@ray.remote(max_restarts=-1, max_task_retries=0)
class RewardReplica:
    """Runs one reward-server process next to itself and says where it listens.

    It binds the node's address (workers on other nodes must reach it), so it
    always serves behind a bearer token. One watchdog thread starts the server and
    restarts it when it dies, on the same port, so clients retrying the same URL
    find it again. Servers belong to that thread (their parent-death signal is tied
    to it), which lives until stop()."""

    def __init__(self, scorers: str, token: str, redis_url: str | None, device: str) -> None:
        self.args = (scorers, token, redis_url, device)
        self.server = None
        self.port: int | None = None
        self.restarts = 0
        self.error: str | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._first_try = threading.Event()
        self._watcher: threading.Thread | None = None
        # Started on first use, so placement() answers as soon as Ray places the
        # actor; a reconstructed replica starts at once (and never raises here: Ray
        # does not restart an actor whose constructor failed).
        if ray.get_runtime_context().was_current_actor_reconstructed:
            self._watch_start()

    def _launch(self, port: int | None):
        from .process import RewardServerProcess

        scorers, token, redis_url, device = self.args
        host = ray.util.get_node_ip_address()
        args = ["--scorers", scorers, "--host", host, "--token-env", TOKEN_VAR]
        args += ["--device", device]
        if redis_url:
            args += ["--redis-url", redis_url]
        return RewardServerProcess(
            *args, env={TOKEN_VAR: token}, quiet=True, host=host, port=port, die_with_parent=True
        )

    def _watch_start(self) -> None:
        with self._lock:
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, daemon=True)
                self._watcher.start()

    def _watch(self) -> None:
        backoff = 0.0
        while not self._stopping.wait(backoff):
            old = self.server
            if old is not None and old.proc.poll() is None:
                backoff = 0.5
                continue
            if old is not None:  # into the Ray worker log: why it died
                print(
                    f"reward server on port {old.port} exited ({old.proc.returncode}); "
                    f"restarting. Its last output:\n{old.output_tail()}",
                    file=sys.stderr,
                    flush=True,
                )
            try:
                new = self._launch(self.port)  # outside the lock: this can take a while
            except Exception as exc:
                if "address already in use" in str(exc).lower():
                    self.port = None  # taken meanwhile: the next try picks a new one
                self.error = f"train.reward (scorers {self.args[0]}): {exc}"
                self._first_try.set()
                backoff = min(max(2 * backoff, 0.5), 30.0)
                continue
            with self._lock:
                if self._stopping.is_set():
                    new.stop()
                    return
                self.server, self.port, self.error = new, new.port, None
                self.restarts += old is not None
            self._first_try.set()
            backoff = 0.5

    def url(self) -> str:
        """Where the server listens. Only a failed *first* start raises (a config
        error, reported at once); afterwards the last URL is kept while the
        watchdog restarts the server on it."""
        self._watch_start()
        self._first_try.wait()
        if self.server is None:
            raise RunFailed(self.error)
        return self.server.url

    def ready(self) -> bool:
        return bool(self.url())

    def server_pid(self) -> int | None:
        server = self.server
        return server.proc.pid if server is not None else None

    def placement(self) -> dict:
        from ..common.placement import where_am_i

        return where_am_i()

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            if self.server is not None:
                self.server.stop()


def scorer_specs(cfg: G2RPOConfig) -> dict[str, str]:
    """name -> "name" or "name=local_dir": the configured rewards plus reward.scorers."""
    specs: dict[str, str] = {}
    for entry in [x.name for x in cfg.rewards] + list(cfg.train.reward.scorers):
        name, _, path = entry.partition("=")
        if path or name not in specs:
            specs[name] = entry
    return specs


class RewardSource:
    """The reward endpoints of a run, handed to the rollout workers each iteration."""

    def __init__(self, cfg: G2RPOConfig, redis_url: str | None) -> None:
        r = cfg.train.reward
        self.static_urls, self.redis_url = list(r.urls), redis_url or r.redis_url
        count = r.job_replicas(redis_url)
        if count == 0 and not self.static_urls and not self.redis_url:
            raise ConfigError(
                "train.reward: no reward servers: give urls or redis_url, or replicas >= 1"
            )
        self.token = os.environ.get(r.token_env) if r.token_env else None
        if r.token_env and not self.token:
            raise ConfigError(
                f"train.reward.token_env: environment variable {r.token_env} is unset"
            )
        specs = scorer_specs(cfg)
        self.scorers = list(specs)
        # A replica with a job-only token registers in Redis only when the token is
        # shared (token_env): other jobs discovering it would just be refused.
        register = self.redis_url if r.token_env else None
        if count and self.token is None:
            self.token = secrets.token_urlsafe(24)  # this job's replicas only
        options = r.ray_options()
        device = "cuda" if r.num_gpus > 0 else "cpu"
        self.replicas = [
            RewardReplica.options(**options).remote(
                ",".join(specs.values()), self.token, register, device
            )
            for _ in range(count)
        ]
        self.replica_urls: list[str] = []

    def refresh(self, timeout: float | None = None, strict: bool = False) -> None:
        """Ask the job's replicas where they listen. A replica that cannot answer
        now (restarting) keeps its last URL; ``strict`` (at start) raises instead."""
        urls = []
        for i, actor in enumerate(self.replicas):
            try:
                urls.append(ray.get(actor.url.remote(), timeout=timeout))
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
                if strict:
                    raise
                urls.append(self.replica_urls[i] if i < len(self.replica_urls) else None)
        self.replica_urls = urls

    def endpoints(self) -> RewardEndpoints:
        urls = self.static_urls + [u for u in self.replica_urls if u]
        return RewardEndpoints(urls, self.redis_url, self.token, self.scorers)

    def close(self) -> None:
        """Stop every replica's server (one wait for all), then end the actors."""
        stops = [a.stop.remote() for a in self.replicas]
        if stops:
            ray.wait(stops, num_returns=len(stops), timeout=30)
        for actor in self.replicas:
            ray.kill(actor, no_restart=True)
        self.replicas = []
