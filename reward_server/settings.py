"""Reward-server settings (one pydantic model, filled from the command line)."""

from __future__ import annotations

import ipaddress
import os
import socket
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..common.cluster.redis_access import RedisPassword, check_redis_password
from ..common.errors import UsageError
from .security import HOW_TO_MAKE, check_token, token_problem
from .tls import check_server_tls


class ScorerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    path: str | None = None

    @classmethod
    def parse(cls, text: str) -> ScorerSpec:
        """``NAME`` or ``NAME=LOCAL_DIR``."""
        name, _, path = text.partition("=")
        if not name.strip():
            raise UsageError(f"--scorers: empty scorer name in {text!r}")
        return cls(name=name.strip(), path=path.strip() or None)


class ServerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    scorers: list[ScorerSpec] = Field(min_length=1)
    host: str = "127.0.0.1"
    port: int = Field(8300, ge=0, le=65535)
    redis_url: str | None = None
    redis_password: RedisPassword | None = Field(
        None, repr=False, description="--redis-password-env, train.reward.redis_password_env"
    )
    token: str | None = Field(None, repr=False)
    tls_cert_file: str | None = Field(None, description="serve HTTPS with this certificate")
    tls_key_file: str | None = Field(None, description="the certificate's private key")
    insecure: bool = False
    max_batch: int = Field(64, ge=1)
    max_wait_ms: float = Field(5.0, ge=0)
    max_payload_bytes: int = Field(
        64 * 2**20,
        ge=1024,
        description="request bodies over this many bytes are refused (413): --max-payload-mib, "
        "train.reward.max_payload_mib for a job's replicas",
    )
    max_images: int = Field(1024, ge=1)
    max_side: int = Field(2048, ge=8)
    heartbeat_ttl_s: float = Field(6.0, gt=0)
    cache_capacity: int = Field(100_000, ge=0)
    replica_id: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    )
    advertise_url: str | None = None
    device: str = Field("cpu", description="where model scorers (CLIP, PickScore) run")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="model scorers' weights: auto = bfloat16 on CUDA, float32 on CPU"
    )
    # A score's last bits depend on how many threads split its matrix products, and an RL
    # run carries a 1e-7 reward difference into a different run within tens of iterations.
    threads: int | None = Field(
        None,
        ge=1,
        description="torch CPU threads for scoring (default: torch's own, from OMP_NUM_THREADS)",
    )

    @field_validator("token")
    @classmethod
    def _token_fit(cls, token: str | None) -> str | None:
        # the last guard; the command and the driver name where the token came from first
        problem = token_problem(token) if token is not None else None
        if problem is not None:
            raise ValueError(
                f"the reward token (--token-env, or train.reward.token_env for a job's "
                f"replicas) {problem}; {HOW_TO_MAKE}"
            )
        return token

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert_file else "http"

    def url(self) -> str:
        return self.advertise_url or f"{self.scheme}://{self.host}:{self.port}"

    def check_tls(self, cert_name: str = "--tls-cert", key_name: str = "--tls-key") -> None:
        """The certificate and key load (names: the flags or fields they came from)."""
        check_server_tls(self.tls_cert_file, self.tls_key_file, cert_name, key_name)
        if (
            self.tls_cert_file
            and self.advertise_url
            and not self.advertise_url.startswith("https://")
        ):
            raise UsageError(
                f"--advertise-url {self.advertise_url}: this server speaks HTTPS "
                f"({cert_name}), so clients must be sent to an https:// URL"
            )

    def uvicorn_tls(self) -> dict:
        """uvicorn's options for this server's TLS (none without a certificate)."""
        if not self.tls_cert_file:
            return {}
        return {"ssl_certfile": self.tls_cert_file, "ssl_keyfile": self.tls_key_file}

    def check_redis(self) -> None:
        """A Redis that refuses this server's password (or wants one) says so now, in one
        line, rather than as the app's failed start."""
        if self.redis_url:
            check_redis_password(self.redis_url, self.redis_password)

    def check_bind(self) -> None:
        """Refuse a non-loopback bind without a token unless --insecure."""
        if self.token or self.insecure or is_loopback(self.host):
            return
        raise UsageError(
            f"--host {self.host} is reachable from other machines: set a token with --token-env "
            "VAR, or pass --insecure to serve without one"
        )

    def check_scorers(self) -> None:
        from .scorers.registry import scorer_names

        unknown = [s.name for s in self.scorers if s.name not in scorer_names()]
        if unknown:
            raise UsageError(f"--scorers {unknown}: unknown; known: {', '.join(scorer_names())}")

    def check_device(self) -> None:
        if self.device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise UsageError(f"--device {self.device}: no CUDA device is visible here")
        elif self.device != "cpu":
            raise UsageError(f"--device {self.device!r}: use cpu, cuda or cuda:N")


def mib_bytes(mib: float) -> int:
    """A size given in MiB (``--max-payload-mib``, ``train.reward.*_mib``) in bytes."""
    return int(mib * 2**20)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_from_env(var: str | None) -> str | None:
    if var is None:
        return None
    value = os.environ.get(var)
    if not value:
        raise UsageError(f"--token-env {var}: the environment variable is unset or empty")
    check_token(value, f"--token-env {var}")
    return value
