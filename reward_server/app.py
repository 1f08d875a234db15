"""The FastAPI reward service: thin handlers around scorers, batchers and the cache."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated

import numpy as np
from fastapi import FastAPI, File, Form, UploadFile
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from .batcher import DynamicBatcher
from .cache import MemoryCache, RedisCache, cache_keys
from .discovery import ReplicaInfo, deregister, register
from .metrics import ServerMetrics
from .schemas import (
    SAFETENSORS_TYPE,
    ErrorResponse,
    HealthResponse,
    ScoreRequest,
    ScoreResponse,
    ScorerInfo,
    ScorersResponse,
)
from .scorers.base import BadInput, Scorer
from .scorers.registry import make_scorer
from .settings import ServerSettings
from .wire import TooLarge, decode_pngs, decode_safetensors

log = logging.getLogger("g2rpo.reward_server")


class _Guard:
    """Pure ASGI middleware in front of the app (cheaper than BaseHTTPMiddleware):
    bearer token on /v1/*, 413 once a body exceeds the limit (declared or read),
    and the request counter/latency of /v1/score."""

    def __init__(self, app, settings: ServerSettings, metrics: ServerMetrics, state: dict):
        self.app, self.limit, self.metrics, self.state = (
            app,
            settings.max_payload_bytes,
            metrics,
            state,
        )
        self.token = f"Bearer {settings.token}".encode() if settings.token else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        headers = dict(scope.get("headers") or [])
        counted = path == "/v1/score"
        if (
            self.token is not None
            and path.startswith("/v1/")
            and (headers.get(b"authorization") != self.token)
        ):
            response = _error(401, "missing or wrong bearer token", "authorization")
            response.headers["WWW-Authenticate"] = "Bearer"
            if counted:
                self.metrics.requests.labels("401").inc()
            return await response(scope, receive, send)
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            if counted:
                self.metrics.requests.labels("413").inc()
            return await _too_large(scope, receive, send, self.limit)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body = message.get("body", b"")
            size += len(body)
            if size > self.limit:
                if counted:
                    self.metrics.requests.labels("413").inc()
                return await _too_large(scope, receive, send, self.limit)
            chunks.append(body)
            more = message.get("more_body", False)
        replay = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        sent = False

        async def replayed():
            nonlocal sent
            if not sent:
                sent = True
                return replay
            return await receive()

        if not counted:
            return await self.app(scope, replayed, send)
        status = {"code": 500}

        async def watched_send(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        start = time.perf_counter()
        self.state["inflight"] += 1
        self.metrics.inflight.inc()
        try:
            await self.app(scope, replayed, watched_send)
        finally:
            self.state["inflight"] -= 1
            self.metrics.inflight.dec()
            self.metrics.requests.labels(str(status["code"])).inc()
            self.metrics.request_seconds.observe(time.perf_counter() - start)


async def _too_large(scope, receive, send, limit):
    response = JSONResponse(
        ErrorResponse(detail=f"request body exceeds {limit} bytes", field="body").model_dump(),
        status_code=413,
    )
    await response(scope, receive, send)


def _error(status: int, detail: str, field: str | None = None) -> JSONResponse:
    return JSONResponse(ErrorResponse(detail=detail, field=field).model_dump(), status_code=status)


def _field_of(message: str) -> str | None:
    head = message.split(":", 1)[0]
    return head.split("[", 1)[0] if head and " " not in head else None


def create_app(
    settings: ServerSettings,
    scorers: dict[str, Scorer] | None = None,
    replica_id: Callable[[], str] | None = None,
) -> FastAPI:
    """The app; ``scorers`` may be given ready-made (tests), else built from the settings.
    ``replica_id``: called at startup to name this replica (one app object serving several
    replicas, as a Ray Serve deployment does)."""
    metrics = ServerMetrics()
    state: dict = {"ready": False, "batchers": {}, "cache": None, "redis": None, "inflight": 0}

    def load_scorers() -> dict[str, Scorer]:
        if scorers is not None:
            return scorers
        built = {}
        for spec in settings.scorers:
            kwargs = {"path": spec.path} if spec.path else {}
            built[spec.name] = make_scorer(
                spec.name, device=settings.device, dtype=settings.dtype, **kwargs
            )
        return built

    async def heartbeat(client, info: ReplicaInfo) -> None:
        while True:
            try:
                load = info.model_copy(update={"load": state["inflight"]})
                await asyncio.to_thread(register, client, load, settings.heartbeat_ttl_s)
            except Exception as exc:  # Redis away: keep serving, retry next beat
                log.warning("heartbeat to Redis failed: %s", exc)
            await asyncio.sleep(settings.heartbeat_ttl_s / 3)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if replica_id is not None:
            settings.replica_id = replica_id()
        loaded = await asyncio.to_thread(load_scorers)
        for name, scorer in loaded.items():
            b = DynamicBatcher(
                scorer,
                settings.max_batch,
                settings.max_wait_ms / 1000.0,
                on_batch=metrics.on_batch,
                on_depth=metrics.on_depth,
            )
            b.start()
            state["batchers"][name] = b
        beat = None
        if settings.redis_url:
            import redis

            client = redis.Redis.from_url(settings.redis_url, socket_timeout=2.0)
            state["redis"] = client
            state["cache"] = RedisCache(client)
            info = ReplicaInfo(
                replica=settings.replica_id,
                url=settings.url(),
                scorers=sorted(loaded),
                pid=os.getpid(),
                started=time.time(),
            )
            await asyncio.to_thread(register, client, info, settings.heartbeat_ttl_s)
            beat = asyncio.get_running_loop().create_task(heartbeat(client, info))
        else:
            state["cache"] = MemoryCache(settings.cache_capacity)
        state["ready"] = True
        try:
            yield
        finally:
            state["ready"] = False
            if beat is not None:
                beat.cancel()
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(deregister, state["redis"], settings.replica_id)
            for b in state["batchers"].values():
                await b.stop()

    app = FastAPI(title="g2rpo reward server", version="1", lifespan=lifespan)

    async def score_one(name: str, images: np.ndarray, prompts: list[str]):
        scorer = state["batchers"][name].scorer
        keys = cache_keys(name, scorer.version, images, prompts)
        cache = state["cache"]
        remote = isinstance(cache, RedisCache)  # network I/O off the event loop
        try:
            hits = await asyncio.to_thread(cache.get_many, keys) if remote else cache.get_many(keys)
        except Exception as exc:
            log.warning("cache read failed: %s", exc)
            hits = [None] * len(keys)
        missing = [i for i, v in enumerate(hits) if v is None]
        start = time.perf_counter()
        if missing:
            fresh = await state["batchers"][name].score(
                images[missing], [prompts[i] for i in missing]
            )
            for i, v in zip(missing, fresh, strict=True):
                hits[i] = float(v)
            fresh_items = {keys[i]: hits[i] for i in missing}
            try:
                if remote:
                    await asyncio.to_thread(cache.set_many, fresh_items)
                else:
                    cache.set_many(fresh_items)
            except Exception as exc:
                log.warning("cache write failed: %s", exc)
        cached = len(keys) - len(missing)
        if cached:
            metrics.cache_hits.labels(name).inc(cached)
        return hits, scorer.version, cached, (time.perf_counter() - start) * 1000

    @app.post(
        "/v1/score",
        response_model=ScoreResponse,
        responses={
            401: {"model": ErrorResponse},
            413: {"model": ErrorResponse},
            422: {"model": ErrorResponse},
            503: {"model": ErrorResponse},
        },
    )
    async def score(
        request_json: Annotated[str, Form(alias="request", description="ScoreRequest as JSON")],
        images: Annotated[list[UploadFile], File(description="one safetensors batch or PNG files")],
    ):
        if not state["ready"]:
            return _error(503, "scorers are still loading")
        start = time.perf_counter()
        try:
            req = ScoreRequest.model_validate_json(request_json)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "request"
            return _error(422, f"request.{where}: {first['msg']}", f"request.{where}")
        unknown = [s for s in req.scorers if s not in state["batchers"]]
        if unknown:
            known = ", ".join(sorted(state["batchers"]))
            return _error(
                422, f"scorers: unknown {unknown}; this replica serves {known}", "scorers"
            )
        try:
            blobs = [await f.read() for f in images]
            safetensors = len(images) == 1 and (
                images[0].content_type == SAFETENSORS_TYPE
                or (images[0].filename or "").endswith(".safetensors")
            )
            if safetensors:
                arr = decode_safetensors(blobs[0])
                if max(arr.shape[1:3]) > settings.max_side:
                    raise TooLarge(
                        f"images: {arr.shape[1]}x{arr.shape[2]} exceeds {settings.max_side} px"
                    )
            else:
                arr = decode_pngs(blobs, settings.max_side)
        except TooLarge as exc:
            return _error(413, str(exc), "images")
        except BadInput as exc:
            return _error(422, str(exc), _field_of(str(exc)) or "images")
        if arr.shape[0] > settings.max_images:
            return _error(
                413, f"images: {arr.shape[0]} images exceed {settings.max_images}", "images"
            )
        if len(req.prompts) != arr.shape[0]:
            return _error(
                422, f"prompts: {len(req.prompts)} prompts for {arr.shape[0]} images", "prompts"
            )
        decoded = time.perf_counter()
        try:
            results = await asyncio.gather(*(score_one(n, arr, req.prompts) for n in req.scorers))
        except BadInput as exc:
            return _error(422, str(exc), _field_of(str(exc)))
        timings = {"decode": (decoded - start) * 1000}
        timings.update({n: r[3] for n, r in zip(req.scorers, results, strict=True)})
        timings["total"] = (time.perf_counter() - start) * 1000
        return ScoreResponse(
            request_id=req.request_id,
            scores={n: r[0] for n, r in zip(req.scorers, results, strict=True)},
            versions={n: r[1] for n, r in zip(req.scorers, results, strict=True)},
            cached={n: r[2] for n, r in zip(req.scorers, results, strict=True)},
            timings_ms=timings,
            replica=settings.replica_id,
        )

    @app.get("/v1/scorers", response_model=ScorersResponse)
    async def list_scorers():
        return ScorersResponse(
            scorers=[
                ScorerInfo(name=n, version=b.scorer.version, max_batch=b.max_batch)
                for n, b in sorted(state["batchers"].items())
            ]
        )

    @app.get("/healthz", response_model=HealthResponse)
    async def healthz():
        return HealthResponse(status="alive", replica=settings.replica_id)

    @app.get("/readyz", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
    async def readyz():
        if not state["ready"]:
            return JSONResponse(
                HealthResponse(status="loading", replica=settings.replica_id).model_dump(),
                status_code=503,
            )
        return HealthResponse(status="ready", replica=settings.replica_id)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(_Guard, settings=settings, metrics=metrics, state=state)
    app.state.settings = settings
    app.state.metrics = metrics
    return app
