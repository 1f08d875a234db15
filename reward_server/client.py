"""Client of the reward service, used by rollout workers.

Finds replicas in Redis (or takes a static URL list), spreads requests over them
(least loaded first, round robin among equals), retries with exponential backoff
and fails over when a replica dies or times out; a request is answered once, and
the servers' score cache makes a retried request free. While Redis does not
answer, the replicas it last listed are used (the control plane may go away; the
replicas serve on). ``submit`` returns a
future at once, so a worker can score one batch while it generates the next.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import threading
import time

import httpx
import numpy as np

from .discovery import live_replicas
from .schemas import SAFETENSORS_TYPE, ScoreRequest, ScoreResponse
from .wire import encode_safetensors

log = logging.getLogger(__name__)


class NoReplicaAvailable(RuntimeError):
    """No live replica answered before the deadline."""


class RewardRequestError(ValueError):
    """The server rejected the request itself (4xx): retrying elsewhere cannot help."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"reward server answered {status}: {detail}")
        self.status = status
        self.detail = detail


class RewardClient:
    def __init__(
        self,
        urls: list[str] | None = None,
        *,
        redis_url: str | None = None,
        token: str | None = None,
        timeout_s: float = 60.0,
        deadline_s: float = 300.0,
        backoff_s: float = 0.1,
        cooldown_s: float = 5.0,
    ) -> None:
        if not urls and not redis_url:
            raise ValueError("RewardClient needs urls or redis_url")
        self.static = [u.rstrip("/") for u in urls or []]
        self.redis = None
        if redis_url:
            import redis

            self.redis = redis.Redis.from_url(redis_url, socket_timeout=2.0)
        self.token = token
        self.timeout_s, self.deadline_s = timeout_s, deadline_s
        self.backoff_s, self.cooldown_s = backoff_s, cooldown_s
        self._down: dict[str, float] = {}
        self._known: list = []  # the replicas Redis last listed: used while it is away
        self.redis_errors = 0  # discoveries Redis did not answer
        self._redis_away = False
        self._turn = itertools.count()
        self.attempts = 0
        self.failovers = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._http = self._call(self._make_http())

    async def _make_http(self) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return httpx.AsyncClient(timeout=self.timeout_s, headers=headers)

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        if self._loop.is_running():
            self._call(self._http.aclose())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ replicas
    def replicas(self, scorers: list[str]) -> list[str]:
        """Candidate URLs, best first: live, least loaded, rotated among equals."""
        urls, load = list(self.static), {}
        if self.redis is not None:  # static URLs and discovered replicas together
            live = [r for r in self._discover() if set(scorers) <= set(r.scorers)]
            load = {r.url.rstrip("/"): r.load for r in live}
            urls = sorted(set(urls) | set(load))
        if not urls:
            return []
        shift = next(self._turn) % len(urls)
        urls = urls[shift:] + urls[:shift]
        now = time.monotonic()
        up = [u for u in urls if self._down.get(u, 0.0) <= now]
        down = [u for u in urls if self._down.get(u, 0.0) > now]
        return sorted(up, key=lambda u: load.get(u, 0)) + down

    def _discover(self) -> list:
        """The live replicas in Redis; while Redis does not answer, the ones it
        listed last (they serve without it, and re-register when it is back)."""
        import redis

        try:
            self._known = live_replicas(self.redis)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self.redis_errors += 1
            if not self._redis_away:
                log.warning(
                    "Redis did not answer (%s); using the %d reward replicas it listed last",
                    exc,
                    len(self._known),
                )
            self._redis_away = True
        else:
            if self._redis_away:
                log.warning("Redis answers again: %d reward replicas listed", len(self._known))
            self._redis_away = False
        return self._known

    # ------------------------------------------------------------------ scoring
    def submit(
        self,
        images: np.ndarray,
        prompts: list[str],
        scorers: list[str],
        request_id: str | None = None,
    ) -> concurrent.futures.Future:
        """Score in the background; the future resolves to a ScoreResponse."""
        return asyncio.run_coroutine_threadsafe(
            self.score_async(images, prompts, scorers, request_id), self._loop
        )

    def score(
        self,
        images: np.ndarray,
        prompts: list[str],
        scorers: list[str],
        request_id: str | None = None,
    ) -> ScoreResponse:
        return self.submit(images, prompts, scorers, request_id).result()

    async def score_async(
        self,
        images: np.ndarray,
        prompts: list[str],
        scorers: list[str],
        request_id: str | None = None,
    ) -> ScoreResponse:
        header = ScoreRequest(scorers=list(scorers), prompts=list(prompts), request_id=request_id)
        body = encode_safetensors(np.asarray(images))
        deadline = time.monotonic() + self.deadline_s
        backoff, last_error = self.backoff_s, "no replica registered"
        while True:
            candidates = await asyncio.to_thread(self.replicas, list(scorers))
            for url in candidates:
                self.attempts += 1
                try:
                    response = await self._http.post(
                        f"{url}/v1/score",
                        data={"request": header.model_dump_json()},
                        files={"images": ("batch.safetensors", body, SAFETENSORS_TYPE)},
                    )
                except httpx.HTTPError as exc:  # refused, reset, timed out: fail over
                    last_error = f"{url}: {type(exc).__name__}: {exc}"
                    self._mark_down(url)
                    continue
                if response.status_code == 200:
                    return ScoreResponse.model_validate(response.json())
                detail = _detail(response)
                if response.status_code in (408, 429) or response.status_code >= 500:
                    last_error = f"{url}: {response.status_code} {detail}"
                    self._mark_down(url)
                    continue
                raise RewardRequestError(response.status_code, detail)
            if time.monotonic() + backoff > deadline:
                raise NoReplicaAvailable(
                    f"no reward replica answered within {self.deadline_s:.0f} s "
                    f"(last error: {last_error})"
                )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    def _mark_down(self, url: str) -> None:
        self.failovers += 1
        self._down[url] = time.monotonic() + self.cooldown_s


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail"))
    except Exception:
        return response.text[:200]
