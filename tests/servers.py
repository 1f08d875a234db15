"""Real services for integration tests: a Redis server and reward-server processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from g2rpo.common.net import free_port
from g2rpo.reward_server.process import RewardServerProcess, g2rpo_executable

G2RPO = g2rpo_executable()
__all__ = [
    "G2RPO",
    "PrometheusServer",
    "RedisServer",
    "RewardServerProcess",
    "free_port",
    "local_ray",
]


@contextmanager
def local_ray(num_cpus: int, object_store_mb: int | None = None):
    """A local Ray of ``num_cpus`` CPUs for a test module (no dashboard, no worker
    logs, no auth), shut down afterwards."""
    import ray

    os.environ["RAY_AUTH_MODE"] = "disabled"
    extra = {} if object_store_mb is None else {"object_store_memory": object_store_mb * 2**20}
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, **extra)
    try:
        yield
    finally:
        ray.shutdown()


class RedisServer:
    def __init__(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (.ci/run installs it)")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{self.port}/0"
        import redis

        self.client = redis.Redis.from_url(self.url)
        for _ in range(200):
            try:
                if self.client.ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not answer PING")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


class PrometheusServer:
    """Debian's ``prometheus`` on a free loopback port with a given config file."""

    def __init__(self, config: Path, data: Path) -> None:
        exe = shutil.which("prometheus")
        if exe is None:
            raise RuntimeError("prometheus is not installed (.ci/run installs it)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (data.parent / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                exe,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        from g2rpo.reward_server.process import wait_http_ready

        wait_http_ready(
            f"{self.url}/-/ready",
            self.proc,
            30.0,
            exited=lambda: f"prometheus exited: see {self.log.name}",
            what="prometheus",
        )

    def query(self, expr: str) -> list:
        import httpx

        body = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        if body["status"] != "success":
            raise RuntimeError(f"{expr}: {body}")
        return body["data"]["result"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()
