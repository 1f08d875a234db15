"""Real services for integration tests: a Redis server and reward-server processes."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from g2rpo.common.cluster.net import free_port
from g2rpo.reward_server.process import RewardServerProcess, g2rpo_executable

G2RPO = g2rpo_executable()
__all__ = [
    "G2RPO",
    "PrometheusServer",
    "RayHead",
    "RedisServer",
    "RewardServerProcess",
    "free_port",
    "session_ray_aside",
    "session_ray_env",
    "start_local_ray",
]


def start_local_ray() -> None:
    """The tests' local Ray in this process: 16 CPUs (a run's 2 rollout workers, up to
    2 learners, the job's reward replicas and the evaluator, 1 each; the actors
    conftest's ``warm`` keeps between runs; the `g2rpo train` processes that join
    it, two of them at once for `g2rpo compare`), 4 GPUs it does not have (declared:
    the colocated layout's bundles get GPU ids, tests/test_colocated.py; the models
    stay on the CPU), no dashboard, no worker logs, no auth. Started by ``ray.init``
    (not ``ray start``), so it leaves no address file behind: a ``g2rpo train``
    process a test starts gets a Ray of its own."""
    import ray

    os.environ["RAY_AUTH_MODE"] = "disabled"
    # Serve's controller kills a proxy that is not ready within 5 s (its default) and
    # serve.start then fails on the dead proxy: on 2 loaded cores the proxy's imports take
    # longer (CI of 5cfe164, tests/test_serve.py). Workers inherit this process's
    # environment, so the controller reads the longer bound.
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    ray.init(
        num_cpus=16,
        num_gpus=4,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=256 * 2**20,
    )


@contextlib.contextmanager
def session_ray_aside():
    """For a test that connects this process to a cluster of its own: the tests' local
    Ray steps aside (a process is connected to one Ray at a time) and, when it was
    running, is started again after. Without that restart the next test's first Ray
    call would start a default Ray of os.cpu_count() CPUs, where a training run's
    actors wait for CPUs forever (the whole suite in one pytest process, 2026-11-28)."""
    import ray

    was_running = ray.is_initialized()
    ray.shutdown()
    try:
        yield
    finally:
        ray.shutdown()
        if was_running:
            start_local_ray()


def session_ray_env() -> dict:
    """The environment of a ``g2rpo`` process that joins the tests' local Ray (conftest's
    ``ray_local``) through RAY_ADDRESS, as a job joins a cluster: it starts no Ray of its
    own (that start and stop is seconds of CPU on 2 cores)."""
    import ray

    return dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        RAY_AUTH_MODE="disabled",
        RAY_ADDRESS=ray.get_runtime_context().gcs_address,
    )


class RedisServer:
    """redis-server as the deployments run it (no persistence) on a free port of its
    own; ``stop`` and ``start`` again bring it back on that same port, empty. With
    ``password`` it requires it (``--requirepass``), as the deployments' does."""

    def __init__(self, password: str | None = None) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.password = password
        self.proc = None
        self.start()

    def start(self) -> None:
        import redis

        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (.ci/run installs it)")
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        if self.password is not None:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(
            [exe, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.client = redis.Redis.from_url(self.url, password=self.password)
        for _ in range(250):
            try:
                if self.client.ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not answer PING")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
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


AGENT_PORTS = (
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
    "ray-client-server-port",
)


class RayHead:
    """``ray start --head --block`` as a process group of its own, under a temp dir of
    its own (its address file is nobody else's default), with the job server on a
    free loopback port. ``stop()`` signals that group and then whatever still names
    the temp dir: only the processes this head started, never another Ray."""

    def __init__(self, num_cpus: int, log: Path) -> None:
        ray = shutil.which("ray") or os.path.join(os.path.dirname(sys.executable), "ray")
        # short: Ray's socket paths under the temp dir must fit in 107 bytes
        self.temp_dir = tempfile.mkdtemp(prefix="g2rpo-head-", dir="/tmp")
        self.port, dashboard = free_port(), free_port()
        self.dashboard_url = f"http://127.0.0.1:{dashboard}"
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        self.env.pop("RAY_ADDRESS", None)
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            [
                ray,
                "start",
                "--head",
                "--block",
                f"--port={self.port}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={dashboard}",
                f"--num-cpus={num_cpus}",
                f"--temp-dir={self.temp_dir}",
                "--disable-usage-stats",
                # ports of its own: a Ray already on this machine (the session's, a
                # user's) holds the defaults, and a job agent that cannot bind never
                # takes a job
                *(f"--{name}={free_port()}" for name in AGENT_PORTS),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        try:  # `ray start` says so once the head and its job agent are up
            deadline = time.monotonic() + 180
            while "Ray runtime started" not in log.read_text():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"ray start --head did not start: see {log}")
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise

    def _left(self) -> list:
        from g2rpo.orchestration.local_nodes import processes_naming

        return processes_naming(self.temp_dir)

    def stop(self) -> None:
        import psutil

        self.proc.send_signal(signal.SIGTERM)  # `ray start --block` stops what it started
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):  # then the rest of its process group
            os.killpg(self.proc.pid, signal.SIGKILL)
        _, alive = psutil.wait_procs(self._left(), timeout=30)
        for proc in alive:  # ours by construction: they name this head's temp dir
            proc.kill()
        self.log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
