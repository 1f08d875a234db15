"""``train.reward``: the reward service a run scores with (static URLs, Redis discovery,
or replicas the job starts as Ray actors), its security (bearer token, Redis password,
TLS) and its request sizes."""

from __future__ import annotations

from pydantic import Field, model_validator

from .actor import ActorResources


class RewardServiceConfig(ActorResources):
    """``train.reward``: the reward service; num_cpus/num_gpus/resources per
    job-started replica."""

    urls: list[str] = Field(default_factory=list, description="static replica URLs")
    redis_url: str | None = Field(None, description="discover replicas in this Redis")
    replicas: int | None = Field(
        None,
        ge=0,
        description="reward-server replicas the job starts as Ray actors "
        "(None: 1 when no urls/redis_url are given, else 0)",
    )
    scorers: list[str] = Field(
        default_factory=list,
        description="NAME or NAME=LOCAL_DIR: what job-started replicas serve besides the "
        "rewards; every held-out evaluation scores these too (a scorer not trained on is a "
        "held-out reward: eval/drift/*), on whichever replicas serve the run",
    )
    token_env: str | None = Field(
        None,
        description="env var holding the reward servers' bearer token (at least 32 bytes: "
        "`openssl rand -hex 32`); None: the job's replicas get a fresh one of their own",
    )
    redis_password_env: str | None = Field(
        None,
        description="env var holding the password of the Redis replicas register in "
        "(redis_url, --redis-url); the value stays in memory, never in config.yaml",
    )
    tls_ca_file: str | None = Field(
        None,
        description="CA bundle (PEM) the driver and workers verify https:// reward servers "
        "with (None: the system's CAs)",
    )
    tls_cert_file: str | None = Field(
        None,
        description="certificate (PEM) the job's replicas serve HTTPS with: a path on "
        "every node they may run on, naming the nodes' addresses",
    )
    tls_key_file: str | None = Field(
        None, description="private key of tls_cert_file, a path on the same nodes"
    )
    deadline_s: float = Field(
        300.0,
        gt=0,
        description="a scoring request no replica answered by then fails the rollout share",
    )
    request_mib: float = Field(
        32.0,
        gt=0,
        description="largest body of one scoring request a worker or the evaluator sends: a "
        "rollout's leaves (193 images of 720² are 286 MiB) go as several requests of at most "
        "this size, sent concurrently",
    )
    concurrency: int = Field(
        4, ge=1, description="scoring requests one worker or the evaluator keeps in flight"
    )
    max_payload_mib: float = Field(
        64.0,
        gt=0,
        description="request body limit of the replicas this job starts (`g2rpo reward-server "
        "--max-payload-mib` for your own): at least train.reward.request_mib",
    )
    in_pairs: bool = Field(
        False,
        description="train.placement colocated: place the job's replicas inside the colocated "
        "pairs' placement bundles (replica j in pair j·pairs/replicas) and on their GPU, where "
        "it scores while the pair's worker waits for its scores, instead of on GPUs of their "
        "own (an HPS scorer holds ~2.8 GiB: `g2rpo plan` counts it in the pair's GPU). Needs "
        "1 <= replicas <= train.learner.count and train.workers.num_gpus + "
        "train.learner.num_gpus + train.reward.num_gpus <= 1 (e.g. 0.45 + 0.45 + 0.1)",
    )

    @model_validator(mode="after")
    def _request_fits_replicas(self) -> RewardServiceConfig:
        if self.request_mib > self.max_payload_mib:
            raise ValueError(
                f"train.reward.request_mib {self.request_mib:g} is over "
                f"train.reward.max_payload_mib {self.max_payload_mib:g}: the job's replicas "
                "would refuse every full request (raise max_payload_mib, or lower request_mib)"
            )
        return self

    @model_validator(mode="after")
    def _certificate_with_its_key(self) -> RewardServiceConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            given, missing = (
                ("tls_cert_file", "tls_key_file")
                if self.tls_key_file is None
                else ("tls_key_file", "tls_cert_file")
            )
            raise ValueError(
                f"train.reward.{given} is given without train.reward.{missing}: the job's "
                "replicas need a certificate and its private key"
            )
        return self

    def job_replicas(self, redis_url: str | None = None) -> int:
        """Replicas the job starts: ``replicas``, or by default one only when no
        external ones are given (``redis_url``: one passed on the command line)."""
        if self.replicas is not None:
            return self.replicas
        return int(not (self.urls or self.redis_url or redis_url))
