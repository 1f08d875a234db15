"""Where a run's rewards come from: static replica URLs, replicas discovered in
Redis, and replicas the job starts itself as Ray actors placed by resources (each
one a reward server inside its actor's process: replica_actor.RewardReplica)."""

from __future__ import annotations

import os
import secrets

import ray

from ..common.cluster.redis_access import check_redis_password, redis_password
from ..common.config.run import G2RPOConfig
from ..common.errors import ConfigError
from ..common.wire.messages import RewardEndpoints
from .replica_actor import RewardReplica
from .security import check_token
from .settings import mib_bytes
from .tls import client_verify, require_https


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

    def __init__(
        self, cfg: G2RPOConfig, redis_url: str | None, placements: list[dict] | None = None
    ) -> None:
        """``placements``: each job replica's placement options beside its resources (a
        learner bundle under train.reward.in_pairs: orchestration/placement.py)."""
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
        if self.token is not None:  # before any actor starts, as the servers would refuse it
            check_token(self.token, f"train.reward.token_env {r.token_env}")
        # in memory only: to the workers in RewardEndpoints, to the replicas as an argument
        self.redis_password = redis_password(r.redis_password_env) if self.redis_url else None
        if self.redis_url:  # a refused (or missing) password says so before any actor starts
            check_redis_password(self.redis_url, self.redis_password)
        client_verify(r.tls_ca_file)  # the bundle the driver and the workers verify with
        if r.tls_ca_file:  # the workers' clients then send to https:// replicas only
            require_https(self.static_urls, "train.reward.urls")
            if count and not r.tls_cert_file:
                raise ConfigError(
                    "train.reward.tls_ca_file is set, so reward replicas are reached over "
                    "https:// only: the job's own replicas need train.reward.tls_cert_file "
                    "and tls_key_file"
                )
        specs = scorer_specs(cfg)
        self.scorers = list(specs)
        # A replica with a job-only token registers in Redis only when the token is
        # shared (token_env): other jobs discovering it would just be refused.
        register = self.redis_url if r.token_env else None
        if count and self.token is None:
            self.token = secrets.token_urlsafe(32)  # this job's replicas only
        options = cfg.train.ray_options(r)
        # on the GPU Ray gives them, where the run's models run on GPUs (a CPU run that
        # asks Ray for GPUs is placing, as `g2rpo rehearse` does: it scores on the CPU)
        on_gpu = r.num_gpus > 0 and cfg.model.device.startswith("cuda")
        device = "cuda" if on_gpu else "cpu"
        self.replicas = [
            RewardReplica.options(**options, **(placements[i] if placements else {})).remote(
                ",".join(specs.values()),
                self.token,
                register,
                device,
                cfg.train.threads,
                mib_bytes(r.max_payload_mib),
                redis_password=self.redis_password if register else None,
                tls=(r.tls_cert_file, r.tls_key_file) if r.tls_cert_file else None,
            )
            for i in range(count)
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
        return RewardEndpoints(
            urls, self.redis_url, self.token, self.scorers, redis_password=self.redis_password
        )

    def close(self) -> None:
        """Stop every replica's server (one wait for all), then end the actors."""
        stops = [a.stop.remote() for a in self.replicas]
        if stops:
            ray.wait(stops, num_returns=len(stops), timeout=30)
        for actor in self.replicas:
            ray.kill(actor, no_restart=True)
        self.replicas = []
