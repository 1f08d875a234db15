"""A reward server hosted inside a Ray actor: the app ``g2rpo reward-server`` runs
(``create_app``), on a uvicorn server in a thread of the actor's own process. Ray
supervises it like any actor (``max_restarts``); nothing here forks or watches a
process."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from pathlib import Path

import ray

from ..common.errors import RunFailed


def _port_file() -> Path:
    """Where this actor keeps its port across restarts on a node: named by the actor
    id, which Ray keeps when it restarts the actor."""
    actor = ray.get_runtime_context().get_actor_id()
    return Path(tempfile.gettempdir()) / f"g2rpo-reward-replica-{actor}.port"


@ray.remote(max_restarts=-1, max_task_retries=0)
class RewardReplica:
    """One reward server in this actor's process, bound to the node's address (workers
    on other nodes must reach it), so always behind a bearer token.

    When the process dies (killed, out of memory), Ray restarts the actor, which serves
    again on the port it had (kept in a file on the node under its actor id), so a
    client retrying the URL finds it again; on another node, or if the port was taken
    meanwhile, it takes a new one and the driver hands the new URL out with the next
    iteration."""

    def __init__(
        self,
        scorers: str,
        token: str,
        redis_url: str | None,
        device: str,
        threads: int | None = None,  # None: torch's own (OMP_NUM_THREADS)
        max_payload_bytes: int = 64 * 2**20,  # train.reward.max_payload_mib
        redis_password=None,  # RedisPassword (train.reward.redis_password_env), in memory
        tls: tuple[str, str] | None = None,  # train.reward.tls_cert_file, tls_key_file
    ) -> None:
        self.args = (scorers, token, redis_url, device, threads, max_payload_bytes)
        self.redis_password, self.tls = redis_password, tls
        self.server = None
        self.thread: threading.Thread | None = None
        self.error: str | None = None
        self._lock = threading.Lock()
        # Started on first use, so placement() answers as soon as Ray places the actor; a
        # restarted replica starts at once (and never raises here: Ray does not restart
        # an actor whose constructor failed).
        if ray.get_runtime_context().was_current_actor_reconstructed:
            self._start()

    def _settings(self):
        from .settings import ScorerSpec, ServerSettings

        scorers, token, redis_url, device, threads, max_payload_bytes = self.args
        settings = ServerSettings(
            scorers=[ScorerSpec.parse(s) for s in scorers.split(",") if s.strip()],
            host=ray.util.get_node_ip_address(),
            port=0,  # chosen in _start
            redis_url=redis_url,
            token=token,
            device=device,
            threads=threads,
            max_payload_bytes=max_payload_bytes,
            redis_password=self.redis_password,
            tls_cert_file=self.tls[0] if self.tls else None,
            tls_key_file=self.tls[1] if self.tls else None,
        )
        settings.check_scorers()
        settings.check_device()
        # on this node: the paths are the node's
        settings.check_tls("train.reward.tls_cert_file", "train.reward.tls_key_file")
        return settings

    @staticmethod
    def _serve(settings, scorers: dict):
        """A uvicorn server on ``settings.port`` in a thread, once its app has started
        (registered in Redis); None if the port could not be bound."""
        import uvicorn

        from .app import create_app

        app = create_app(settings, scorers=scorers)
        config = uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level="warning",
            lifespan="on",
            **settings.uvicorn_tls(),
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, name="reward-server", daemon=True)
        thread.start()
        while not server.started:
            if not thread.is_alive():  # uvicorn logged why: the port was taken
                return None
            time.sleep(0.02)
        return server, thread

    def _start(self) -> None:
        from ..common.cluster.net import free_port
        from .replica_state import load_scorers, pin_threads

        with self._lock:
            if self.thread is not None and self.thread.is_alive():
                return
            try:
                settings = self._settings()
                pin_threads(settings)
                # loaded once, here, so a scorer that cannot load raises its own error
                scorers = load_scorers(settings)
                port_file = _port_file()
                kept = int(port_file.read_text()) if port_file.is_file() else 0
                for port in (kept, 0):  # the kept port, else (taken meanwhile) any free one
                    on_port = settings.model_copy(update={"port": port or free_port(settings.host)})
                    started = self._serve(on_port, scorers)
                    if started is not None:
                        break
                else:
                    raise RunFailed("the reward server could not bind a port")
                self.server, self.thread = started
                port_file.write_text(f"{self.server.config.port}\n")
                self.error = None
            except Exception as exc:
                self.error = f"train.reward (scorers {self.args[0]}): {exc}"

    def url(self) -> str:
        """Where the server listens; raises (RunFailed) if it could not start."""
        self._start()
        if self.error is not None:
            raise RunFailed(self.error)
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{self.server.config.host}:{self.server.config.port}"

    def ready(self) -> bool:
        return bool(self.url())

    def server_pid(self) -> int:
        return os.getpid()  # the server is this process

    def placement(self) -> dict:
        from ..common.cluster.placement import where_am_i

        return where_am_i()

    def stop(self) -> None:
        """Stop serving (the app deregisters from Redis) and forget the port."""
        with self._lock:
            if self.server is not None:
                self.server.should_exit = True
                self.thread.join(timeout=20)
            with contextlib.suppress(OSError):
                _port_file().unlink()
