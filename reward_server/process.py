"""A reward server as a child process (``g2rpo reward-server``), ready when /readyz is."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def g2rpo_executable() -> str:
    return shutil.which("g2rpo") or os.path.join(os.path.dirname(sys.executable), "g2rpo")


def _die_with_parent() -> None:
    """Linux: SIGTERM the child when the process that started it dies, so a killed
    Ray actor does not leave its server behind (no portable stdlib way exists)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class RewardServerProcess:
    def __init__(
        self,
        *args: str,
        env: dict | None = None,
        ready: bool = True,
        quiet: bool = False,
        host: str = "127.0.0.1",
        port: int | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        out = subprocess.DEVNULL if quiet else subprocess.PIPE
        self.proc = subprocess.Popen(
            [g2rpo_executable(), "reward-server", "--port", str(self.port), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
            preexec_fn=_die_with_parent if die_with_parent and sys.platform == "linux" else None,
        )
        if ready:
            self.wait_ready()

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                said = self.proc.stdout.read() if self.proc.stdout else ""
                raise RuntimeError(f"reward server exited at start: {said}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("reward server not ready in time")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
