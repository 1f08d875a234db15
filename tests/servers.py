"""Real services for integration tests: a Redis server and reward-server processes."""

from __future__ import annotations

import shutil
import subprocess
import time

from g2rpo.reward_server.process import RewardServerProcess, free_port, g2rpo_executable

G2RPO = g2rpo_executable()
__all__ = ["G2RPO", "RedisServer", "RewardServerProcess", "free_port"]


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
