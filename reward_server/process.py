"""A reward server as a child process (``g2rpo reward-server``), ready when /readyz is."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import httpx

from ..common.cluster.net import free_port


def g2rpo_executable() -> str:
    return shutil.which("g2rpo") or os.path.join(os.path.dirname(sys.executable), "g2rpo")


class RewardServerProcess:
    def __init__(
        self,
        *args: str,
        env: dict | None = None,
        ready: bool = True,
        quiet: bool = False,
        host: str = "127.0.0.1",
        port: int | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.port = port or free_port(host)
        scheme = "https" if "--tls-cert" in args else "http"
        self.url = f"{scheme}://{host}:{self.port}"
        self.ca_file = ca_file  # what /readyz over HTTPS is verified with (None: system CAs)
        # quiet: the output goes to a file (open as long as the process runs) that is
        # read back only if the start fails
        self._log = tempfile.TemporaryFile(mode="w+") if quiet else None  # noqa: SIM115
        self.proc = subprocess.Popen(
            [g2rpo_executable(), "reward-server", "--port", str(self.port), *args],
            stdout=self._log or subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        if ready:
            try:
                self.wait_ready()
            except BaseException:
                self.kill()  # never leave a half-started server holding the port
                raise

    def output_tail(self) -> str:
        if self._log is not None:
            self._log.seek(0)
            return self._log.read()[-2000:]
        return self.proc.stdout.read() if self.proc.stdout else ""

    def wait_ready(self, timeout: float = 120.0) -> None:
        wait_http_ready(
            f"{self.url}/readyz",
            self.proc,
            timeout,
            exited=lambda: f"reward server exited at start: {self.output_tail().strip()}",
            what="reward server",
            verify=self.ca_file or True,
        )

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:  # stuck shutting down: it must not keep the port
                self.kill()


def wait_http_ready(url: str, proc, timeout: float, *, exited, what: str, verify=True) -> None:
    """Poll ``url`` until it answers 200; raise if ``proc`` exits first (with the
    message ``exited()`` builds) or after ``timeout`` seconds. ``verify``: httpx's (a CA
    bundle's path for an https:// URL)."""
    if isinstance(verify, str):
        import ssl

        verify = ssl.create_default_context(cafile=verify)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(exited())
        try:
            if httpx.get(url, timeout=1.0, verify=verify).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} not ready in {timeout:.0f} s")
