"""The FastAPI reward service: thin handlers around scorers, batchers and the cache.

Every refused request is answered in one shape, ErrorResponse ``{"detail", "field"}``,
whoever refuses it: the handlers and their dependencies raise ``ApiError`` (or a
scorer's ``BadInput``/``TooLarge``), FastAPI's own validation raises
RequestValidationError, and the exception handlers of api_errors.py, installed by
create_app, turn each into that shape. The replica's state and startup: replica_state.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import Callable
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Depends, FastAPI, File, Form, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException

from .api_errors import (
    ApiError,
    body_too_large,
    describe_errors,
    error_response,
    on_bad_input,
    on_http_error,
    on_too_large,
    on_validation_error,
)
from .cache import RedisCache, cache_keys
from .embeddings import check_embeddable, embed_images
from .metrics import ServerMetrics
from .replica_state import ServerState, lifespan
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
from .settings import ServerSettings
from .wire import TooLarge, decode_pngs, decode_safetensors

log = logging.getLogger("g2rpo.reward_server")

SCORE_PATH = "/v1/score"


# --- ASGI wrappers ----------------------------------------------------------------------


class _BodyLimit:
    """413 once a request body exceeds ``limit`` bytes, declared or streamed.

    Pure ASGI rather than a FastAPI dependency: FastAPI reads and parses a form body
    before it runs any dependency, so a dependency would only see a body already taken
    in. A declared Content-Length over the limit is answered before anything is read; a
    body without one (chunked) is counted as it streams and refused at the first chunk
    past the limit, by raising ApiError inside the app, where its handler answers."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            refused = body_too_large(self.limit)
            response = error_response(refused.status_code, refused.detail, refused.field)
            return await response(scope, receive, send)
        size = 0

        async def counted():
            nonlocal size
            message = await receive()
            size += len(message.get("body", b""))
            if size > self.limit:
                raise body_too_large(self.limit)
            return message

        return await self.app(scope, counted, send)


class _ScoreMetrics:
    """The request counter (by status), latency and requests in flight of /v1/score.

    Pure ASGI because only here is the status of every answer seen, whichever part gave
    it: the handler, an exception handler or the body limit."""

    def __init__(self, app, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != SCORE_PATH:
            return await self.app(scope, receive, send)
        state, metrics = self.state, self.state.metrics
        status = 500

        async def watched(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        start = time.perf_counter()
        state.inflight += 1
        metrics.inflight.inc()
        try:
            await self.app(scope, receive, watched)
        finally:
            state.inflight -= 1
            metrics.inflight.dec()
            metrics.requests.labels(str(status)).inc()
            metrics.request_seconds.observe(time.perf_counter() - start)


# --- dependencies -----------------------------------------------------------------------


async def server_state(request: Request) -> ServerState:
    return request.app.state.server


# (async: FastAPI would run a plain def dependency in a worker thread, a hop for nothing)
State = Annotated[ServerState, Depends(server_state)]

_bearer = HTTPBearer(auto_error=False, description="the server's token (--token-env)")


async def require_token(
    state: State,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    token = state.settings.token
    if token is None:
        return
    if credentials is None or not secrets.compare_digest(
        credentials.credentials.encode(), token.encode()
    ):
        raise ApiError(
            401, "missing or wrong bearer token", "authorization", {"WWW-Authenticate": "Bearer"}
        )


async def ready_state(state: State) -> ServerState:
    if not state.ready:
        raise ApiError(503, "scorers are still loading")
    return state


ReadyState = Annotated[ServerState, Depends(ready_state)]


async def score_request(
    request_json: Annotated[str, Form(alias="request", description="ScoreRequest as JSON")],
    state: ReadyState,
) -> ScoreRequest:
    """The ``request`` form part as a ScoreRequest naming scorers this replica serves."""
    try:
        req = ScoreRequest.model_validate_json(request_json)
    except ValidationError as err:
        raise ApiError(422, *describe_errors(err.errors(), prefix="request")) from None
    unknown = [s for s in req.scorers if s not in state.batchers]
    if unknown:
        known = ", ".join(sorted(state.batchers))
        raise ApiError(422, f"scorers: unknown {unknown}; this replica serves {known}", "scorers")
    check_embeddable(req.embed, state.batchers)
    return req


# --- the work off the event loop ----------------------------------------------------------


def read_images(files: list[UploadFile], settings: ServerSettings) -> np.ndarray:
    """The request's images as uint8 [N, H, W, 3], within the server's limits. Blocking
    (file reads, PNG decoding): run it in a worker thread, never on the event loop."""
    blobs = [f.file.read() for f in files]
    if len(files) == 1 and (
        files[0].content_type == SAFETENSORS_TYPE
        or (files[0].filename or "").endswith(".safetensors")
    ):
        arr = decode_safetensors(blobs[0])
        if max(arr.shape[1:3]) > settings.max_side:
            raise TooLarge(f"images: {arr.shape[1]}x{arr.shape[2]} exceeds {settings.max_side} px")
    else:
        arr = decode_pngs(blobs, settings.max_side)
    if arr.shape[0] > settings.max_images:
        raise TooLarge(f"images: {arr.shape[0]} images exceed {settings.max_images}")
    return arr


@dataclasses.dataclass
class _Scored:
    scores: list[float]
    version: str
    cached: int
    ms: float


async def _score_cached(
    state: ServerState, name: str, images: np.ndarray, prompts: list[str]
) -> _Scored:
    """One scorer's scores: cache hits as they are, the rest through its batcher."""
    batcher = state.batchers[name]
    version = batcher.scorer.version
    keys = await run_in_threadpool(cache_keys, name, version, images, prompts)  # hashing
    cache = state.cache
    remote = isinstance(cache, RedisCache)  # network I/O off the event loop
    try:
        hits = await run_in_threadpool(cache.get_many, keys) if remote else cache.get_many(keys)
    except Exception as exc:
        log.warning("cache read failed: %s", exc)
        hits = [None] * len(keys)
    missing = [i for i, v in enumerate(hits) if v is None]
    start = time.perf_counter()
    if missing:
        todo = images if len(missing) == len(keys) else images[missing]  # no copy if all
        fresh = await batcher.score(todo, [prompts[i] for i in missing])
        for i, v in zip(missing, fresh, strict=True):
            hits[i] = float(v)
        fresh_items = {keys[i]: hits[i] for i in missing}
        try:
            if remote:
                await run_in_threadpool(cache.set_many, fresh_items)
            else:
                cache.set_many(fresh_items)
        except Exception as exc:
            log.warning("cache write failed: %s", exc)
    cached = len(keys) - len(missing)
    if cached:
        state.metrics.cache_hits.labels(name).inc(cached)
    return _Scored(hits, version, cached, (time.perf_counter() - start) * 1000)


# --- routes -----------------------------------------------------------------------------

v1 = APIRouter(
    prefix="/v1",
    dependencies=[Depends(require_token)],
    responses={401: {"model": ErrorResponse}},
)
public = APIRouter()


@v1.post(
    "/score",
    response_model=ScoreResponse,
    responses={code: {"model": ErrorResponse} for code in (400, 413, 422, 503)},
)
async def score(
    state: ReadyState,
    req: Annotated[ScoreRequest, Depends(score_request)],
    images: Annotated[list[UploadFile], File(description="one safetensors batch or PNG files")],
) -> ScoreResponse:
    start = time.perf_counter()
    arr = await run_in_threadpool(read_images, images, state.settings)
    if len(req.prompts) != arr.shape[0]:
        raise ApiError(
            422, f"prompts: {len(req.prompts)} prompts for {arr.shape[0]} images", "prompts"
        )
    decoded = time.perf_counter()
    scored = await asyncio.gather(*(_score_cached(state, n, arr, req.prompts) for n in req.scorers))
    results = dict(zip(req.scorers, scored, strict=True))
    timings = {"decode": (decoded - start) * 1000, **{n: r.ms for n, r in results.items()}}
    embeddings = await embed_images(state.batchers, req.embed, arr, timings)
    timings["total"] = (time.perf_counter() - start) * 1000
    return ScoreResponse(
        request_id=req.request_id,
        scores={n: r.scores for n, r in results.items()},
        versions={n: r.version for n, r in results.items()},
        cached={n: r.cached for n, r in results.items()},
        timings_ms=timings,
        replica=state.settings.replica_id,
        embeddings=embeddings,
    )


@v1.get("/scorers", response_model=ScorersResponse)
async def list_scorers(state: State) -> ScorersResponse:
    return ScorersResponse(
        scorers=[
            ScorerInfo(name=n, version=b.scorer.version, max_batch=b.max_batch)
            for n, b in sorted(state.batchers.items())
        ]
    )


@public.get("/healthz", response_model=HealthResponse)
async def healthz(state: State) -> HealthResponse:
    return HealthResponse(status="alive", replica=state.settings.replica_id)


@public.get("/readyz", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
async def readyz(state: State):
    if not state.ready:
        return JSONResponse(
            HealthResponse(status="loading", replica=state.settings.replica_id).model_dump(),
            status_code=503,
        )
    return HealthResponse(status="ready", replica=state.settings.replica_id)


@public.get("/metrics", include_in_schema=False)
async def prometheus_metrics(state: State) -> Response:
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def create_app(
    settings: ServerSettings,
    scorers: dict[str, Scorer] | None = None,
    replica_id: Callable[[], str] | None = None,
) -> FastAPI:
    """The app; ``scorers`` may be given ready-made (tests), else built from the settings.
    ``replica_id``: called at startup to name this replica (one app object serving several
    replicas, as a Ray Serve deployment does)."""
    state = ServerState(settings, ServerMetrics(), scorers, replica_id)
    app = FastAPI(title="g2rpo reward server", version="1", lifespan=lifespan)
    app.state.server = state
    app.include_router(v1)
    app.include_router(public)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(BadInput, on_bad_input)
    app.add_exception_handler(TooLarge, on_too_large)
    app.add_middleware(_BodyLimit, limit=settings.max_payload_bytes)
    app.add_middleware(_ScoreMetrics, state=state)  # outermost: sees the body limit's 413s
    return app
