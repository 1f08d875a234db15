"""Reward servers as a Ray Serve deployment: the same FastAPI app (``create_app``) behind
Serve's HTTP proxy, autoscaled on requests in flight per replica. Each Serve replica
registers the proxy's URL in Redis under its own replica id, so training jobs find the
deployment like any other replica (and a replica's load steers the client as usual).

    g2rpo reward-serve --scorers hpsv2=DIR --redis-url redis://... \\
        --advertise-url http://HEAD:8000 --min-replicas 1 --max-replicas 8

With ``--tls-cert``/``--tls-key`` Serve's proxy serves HTTPS (its own ssl options, the
files read on each node a proxy runs on) and the replicas register an https:// URL.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..common.errors import UsageError
from .settings import ServerSettings


class ServeOptions(BaseModel):
    """Serve-side settings (the rest is the reward server's own ``ServerSettings``)."""

    model_config = ConfigDict(extra="forbid")
    name: str = "g2rpo-reward"
    route_prefix: str = "/"
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(4, ge=1)
    target_ongoing_requests: float = Field(
        2.0, gt=0, description="requests in flight per replica Serve aims for"
    )
    upscale_delay_s: float = Field(5.0, ge=0)
    downscale_delay_s: float = Field(60.0, ge=0)
    # Serve averages requests in flight over this window; its AutoscalingConfig warns (and
    # is to refuse) a window not longer than metrics_interval_s, whose default is 10 s (the
    # field itself is deprecated for RAY_SERVE_*_AUTOSCALING_METRIC_PUSH_INTERVAL_S, also
    # 10 s by default, so it is left unset here).
    look_back_period_s: float = Field(
        15.0, gt=10.0, description="seconds of load Serve averages; more than Serve's 10 s"
    )
    max_ongoing_requests: int = Field(16, ge=1, description="per replica, beyond which it queues")
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)

    def autoscaling_config(self) -> dict:
        if self.min_replicas > self.max_replicas:
            raise UsageError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}")
        return {
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "target_ongoing_requests": self.target_ongoing_requests,
            "upscale_delay_s": self.upscale_delay_s,
            "downscale_delay_s": self.downscale_delay_s,
            "look_back_period_s": self.look_back_period_s,
        }


def reward_application(settings: ServerSettings, options: ServeOptions):
    """The Serve application: one deployment whose replicas each run ``create_app``."""
    from ray import serve

    from .app import create_app

    def replica_id() -> str:  # one registry entry per Serve replica
        return f"{options.name}-{serve.get_replica_context().replica_id.unique_id}"

    app = create_app(settings, replica_id=replica_id)

    @serve.deployment(
        name=options.name,
        autoscaling_config=options.autoscaling_config(),
        max_ongoing_requests=options.max_ongoing_requests,
        ray_actor_options={"num_cpus": options.num_cpus, "num_gpus": options.num_gpus},
    )
    @serve.ingress(app)
    class RewardServer:
        pass

    return RewardServer.bind()


def proxy_options(settings: ServerSettings, http_port: int) -> dict:
    """Serve's ``http_options``: the proxy's address, and its TLS when the settings have
    a certificate (Serve's HTTPOptions.ssl_certfile/ssl_keyfile)."""
    tls = settings.uvicorn_tls()  # the same option names as uvicorn's
    return {"host": settings.host, "port": http_port, **tls}


def serve_rewards(settings: ServerSettings, options: ServeOptions, http_port: int) -> None:
    """Start Serve's proxy on ``http_port`` (all interfaces of the head when the settings'
    host is public) and run the deployment until interrupted."""
    from ray import serve

    serve.start(http_options=proxy_options(settings, http_port))
    serve.run(
        reward_application(settings, options),
        name=options.name,
        route_prefix=options.route_prefix,
        blocking=True,
    )
