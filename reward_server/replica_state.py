"""One replica's state and lifecycle: what it holds (``ServerState``), loading its
scorers, and the app's lifespan: start a batcher per scorer, register in Redis and keep a
heartbeat (or use a memory cache without Redis), and undo it all at shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI

from ..common.cluster.redis_access import connect_redis
from .batcher import DynamicBatcher
from .cache import MemoryCache, RedisCache
from .discovery import ReplicaInfo, deregister, register
from .metrics import ServerMetrics
from .scorers.base import Scorer
from .scorers.registry import make_scorer
from .settings import ServerSettings

log = logging.getLogger("g2rpo.reward_server")


@dataclasses.dataclass
class ServerState:
    """What one replica holds, on ``app.state.server``."""

    settings: ServerSettings
    metrics: ServerMetrics
    given_scorers: dict[str, Scorer] | None = None  # ready-made (tests); else built at start
    replica_id: Callable[[], str] | None = None
    batchers: dict[str, DynamicBatcher] = dataclasses.field(default_factory=dict)
    cache: MemoryCache | RedisCache | None = None
    redis: Any = None
    ready: bool = False
    inflight: int = 0


def load_scorers(settings: ServerSettings) -> dict[str, Scorer]:
    """Every scorer the settings name, loaded on their device."""
    built = {}
    for spec in settings.scorers:
        kwargs = {"path": spec.path} if spec.path else {}
        built[spec.name] = make_scorer(
            spec.name, device=settings.device, dtype=settings.dtype, **kwargs
        )
    return built


def pin_threads(settings: ServerSettings) -> None:
    """Score with ``settings.threads`` torch CPU threads, when given (the server's whole
    process: call it where the server starts)."""
    if settings.threads is not None:
        import torch

        torch.set_num_threads(settings.threads)


def _load_scorers(state: ServerState) -> dict[str, Scorer]:
    if state.given_scorers is not None:
        return state.given_scorers
    return load_scorers(state.settings)


async def _heartbeat(state: ServerState, client, info: ReplicaInfo) -> None:
    ttl = state.settings.heartbeat_ttl_s
    while True:
        try:
            load = info.model_copy(update={"load": state.inflight})
            await asyncio.to_thread(register, client, load, ttl)
        except Exception as exc:  # Redis away: keep serving, retry next beat
            log.warning("heartbeat to Redis failed: %s", exc)
        await asyncio.sleep(ttl / 3)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: ServerState = app.state.server
    settings, metrics = state.settings, state.metrics
    if state.replica_id is not None:
        settings.replica_id = state.replica_id()
    pin_threads(settings)
    loaded = await asyncio.to_thread(_load_scorers, state)
    for name, scorer in loaded.items():
        batcher = DynamicBatcher(
            scorer,
            settings.max_batch,
            settings.max_wait_ms / 1000.0,
            on_batch=metrics.on_batch,
            on_depth=metrics.on_depth,
        )
        batcher.start()
        state.batchers[name] = batcher
    beat = None
    if settings.redis_url:
        client = connect_redis(settings.redis_url, settings.redis_password)
        state.redis = client
        state.cache = RedisCache(client)
        info = ReplicaInfo(
            replica=settings.replica_id,
            url=settings.url(),
            scorers=sorted(loaded),
            pid=os.getpid(),
            started=time.time(),
        )
        await asyncio.to_thread(register, client, info, settings.heartbeat_ttl_s)
        beat = asyncio.get_running_loop().create_task(_heartbeat(state, client, info))
    else:
        state.cache = MemoryCache(settings.cache_capacity)
    state.ready = True
    try:
        yield
    finally:
        state.ready = False
        if beat is not None:
            beat.cancel()
            with contextlib.suppress(Exception):
                await asyncio.to_thread(deregister, state.redis, settings.replica_id)
        for batcher in state.batchers.values():
            await batcher.stop()
