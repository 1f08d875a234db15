"""A Ray cluster of several nodes on this machine, whose nodes share no filesystem
unless told to: the head (where the driver runs, as on KubeRay: no GPU, no CPU for
actors) and N worker nodes, each ``ray start --block`` in a process group of its own.
Each worker node runs in a mount namespace of its own (``unshare -m``, root only),
started in a working directory of its own, with a Ray temp dir of its own; a path
declared private is bind-mounted over, in that node's namespace only, by a directory
of that node's, so what one node writes there the others and the driver never see.
Nodes may declare GPUs they do not have (``num_gpus``): placement is tested, the
models run on the CPU.

``stop()`` ends each node's process group and then any process still naming its temp
dir: only what this cluster started, never another Ray of the machine's."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..common.cluster.net import free_port
from ..common.errors import RunFailed

# Ray's agents and servers each take a port; a second Ray on the machine (the user's,
# a test session's) holds the defaults, so every one is chosen free here
AGENT_PORTS = (
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
)
START_TIMEOUT_S = 600.0  # a node joining a machine busy with a cluster takes minutes


def ray_executable() -> str:
    return shutil.which("ray") or os.path.join(os.path.dirname(sys.executable), "ray")


@dataclass
class LocalNode:
    name: str
    proc: subprocess.Popen
    temp_dir: str
    home: Path  # the node's own directory: its working directory and private mounts
    log: Path
    private: dict[str, Path] = field(default_factory=dict)  # path seen → where it lies


def processes_naming(path: str) -> list:
    """The processes whose command line names ``path`` (a Ray temp dir: what one Ray
    started, whatever its process group), as psutil Processes with ``info["cmdline"]``."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(path in arg for arg in proc.info["cmdline"] or ()):
                found.append(proc)
    return found


def _need_namespaces() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        raise RunFailed(
            "a rehearsal's nodes need their own mount namespaces: run it as root "
            "(unshare -m), or in a container that allows it"
        )


class LocalCluster:
    """``LocalCluster(root)`` then ``add_head()``, ``add_node(...)`` for each worker
    node; ``address`` is what ``ray.init`` joins; ``stop()`` at the end."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.nodes: list[LocalNode] = []
        self.port: int | None = None
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        self.env.pop("RAY_ADDRESS", None)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _start(self, name: str, args: list[str], wrap: list[str], home: Path) -> LocalNode:
        # short: Ray's socket paths under the temp dir must fit in 107 bytes
        temp_dir = tempfile.mkdtemp(prefix=f"g2rpo-{name}-", dir="/tmp")
        home.mkdir(parents=True, exist_ok=True)
        log = self.root / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        command = [
            ray_executable(),
            "start",
            "--block",
            f"--temp-dir={temp_dir}",
            "--disable-usage-stats",
            *args,
            *(f"--{port}={free_port()}" for port in AGENT_PORTS),
        ]
        with log.open("w") as out:
            proc = subprocess.Popen(
                [*wrap, *command],
                cwd=home,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        node = LocalNode(name, proc, temp_dir, home, log)
        self.nodes.append(node)
        deadline = time.monotonic() + START_TIMEOUT_S
        while "Ray runtime started" not in log.read_text():  # `ray start` says so when up
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RunFailed(
                    f"ray start ({name}) did not start: {log.read_text()[-1500:]}"
                    f"{self._head_state() if name != 'head' else ''}"
                )
            time.sleep(0.2)
        return node

    def _head_state(self) -> str:
        """Whether the head's GCS still runs, and the end of its log: a worker that
        cannot reach the GCS says only "Deadline Exceeded"."""
        head = next((n for n in self.nodes if n.name == "head"), None)
        if head is None:
            return ""
        gcs = [p for p in self._left(head) if "gcs_server" in p.info["cmdline"][0]]
        logs = sorted(Path(head.temp_dir).glob("session_*/logs/gcs_server.*"))
        tail = "".join(f.read_text(errors="replace")[-600:] for f in logs[-2:])
        alive = "running" if gcs else "NOT running"
        state = f"the head's GCS is {alive} (head `ray start` exit {head.proc.poll()})"
        return f"\n{state}; its log ends:\n{tail}"

    def start(
        self,
        object_store_bytes: int,
        nodes: list[dict],
        *,
        attempts: int = 2,
        say=print,
    ) -> None:
        """The head, then each worker node (``nodes``: ``add_node``'s keyword arguments).
        A node that does not start (on a machine busy with other clusters a worker's
        ``ray start`` has been seen to wait 5 minutes on the GCS, then give up) stops the
        whole cluster, which starts again on fresh ports and temp dirs, up to
        ``attempts`` times; the last failure is raised with every attempt's reason."""
        _need_namespaces()
        reasons = []
        for attempt in range(1, attempts + 1):
            try:
                self.add_head(object_store_bytes)
                for node in nodes:
                    self.add_node(**node)
                return
            except RunFailed as exc:
                reasons.append(f"attempt {attempt}: {exc}")
                self.stop()
                logs = self.root / "logs"
                if logs.is_dir():  # the failed attempt's logs stay beside the next one's
                    for log in logs.glob("*.log"):
                        if ".attempt" not in log.name:
                            log.rename(log.with_suffix(f".attempt{attempt}.log"))
                if attempt < attempts:
                    again = f"starting it again ({attempt + 1} of {attempts})"
                    say(f"{exc}\nthe local cluster stopped; {again}")
        raise RunFailed("\n".join(reasons))

    def add_head(self, object_store_bytes: int) -> LocalNode:
        """The head: GCS, the driver's node; no CPUs or GPUs for actors."""
        self.port = free_port()
        args = ["--head", f"--port={self.port}", "--num-cpus=0", "--num-gpus=0"]
        args += ["--include-dashboard=false", f"--object-store-memory={object_store_bytes}"]
        args += [f"--ray-client-server-port={free_port()}"]
        return self._start("head", args, [], self.root / "nodes" / "head")

    def add_node(
        self,
        name: str,
        *,
        num_cpus: int,
        num_gpus: float,
        resources: dict[str, float],
        object_store_bytes: int,
        private: list[Path],
    ) -> LocalNode:
        """A worker node in a mount namespace of its own, where each path of
        ``private`` is replaced by a directory of this node's (under its home)."""
        _need_namespaces()
        home = self.root / "nodes" / name
        mounts = {}
        for path in private:
            mine = home / "private" / str(path).lstrip("/")
            mine.mkdir(parents=True, exist_ok=True)
            Path(path).mkdir(parents=True, exist_ok=True)
            mounts[str(path)] = mine
        binds = " && ".join(f"mount --bind '{mine}' '{seen}'" for seen, mine in mounts.items())
        # the namespace's mounts are its own (private propagation), then the node starts
        script = f'{binds + " && " if binds else ""}exec "$@"'
        wrap = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "node"]
        args = [
            f"--address={self.address}",
            f"--num-cpus={num_cpus}",
            f"--num-gpus={num_gpus:g}",
            f"--resources={json.dumps(resources)}",
            f"--object-store-memory={object_store_bytes}",
        ]
        node = self._start(name, args, wrap, home)
        node.private = {seen: Path(mine) for seen, mine in mounts.items()}
        return node

    def wait_for(self, nodes: int, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until the driver's Ray (``ray.init(address=...)`` done) lists ``nodes`` alive."""
        import ray

        deadline = time.monotonic() + timeout_s
        while sum(n["Alive"] for n in ray.nodes()) < nodes:
            if time.monotonic() > deadline:
                raise RunFailed(f"the rehearsal's {nodes} Ray nodes did not all join")
            time.sleep(0.2)

    def _left(self, node: LocalNode) -> list:
        return processes_naming(node.temp_dir)

    def stop(self) -> None:
        import psutil

        for node in reversed(self.nodes):  # the worker nodes first, the head last
            node.proc.send_signal(signal.SIGTERM)  # `ray start --block` stops its own
        for node in reversed(self.nodes):
            try:
                node.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(timeout=30)
            with contextlib.suppress(ProcessLookupError):  # the rest of its group
                os.killpg(node.proc.pid, signal.SIGKILL)
            _, alive = psutil.wait_procs(self._left(node), timeout=30)
            for proc in alive:  # ours by construction: they name this node's temp dir
                proc.kill()
            shutil.rmtree(node.temp_dir, ignore_errors=True)
        self.nodes = []
