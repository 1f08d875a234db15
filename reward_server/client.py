"""Client of the reward service, used by rollout workers.

Finds replicas in Redis (or takes a static URL list), spreads requests over them
(least loaded first, round robin among equals), retries with exponential backoff
and fails over when a replica dies or times out; a request is answered once, and
the servers' score cache makes a retried request free. While Redis does not
answer, the replicas it last listed are used (the control plane may go away; the
replicas serve on). ``submit`` returns a
future at once, so a worker can score one batch while it generates the next.

A batch goes as several requests of at most ``request_bytes`` each (a FLUX worker's
193 leaves of 720² are 286 MiB, over the server's 64 MiB default body limit), each
encoded only when its turn comes, up to ``concurrency`` of one call's in flight, each
retried and failed over on its own; the answers are merged back into one
ScoreResponse in the images' order (request_chunks.py), and ``last_requests`` lists
the bodies sent. A request the server refuses as too large (413: its limit is below
ours) is split in half, or at once to the limit the server named, and sent again, down
to one image; later batches are cut to that limit from the start.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import math
import threading
import time

import httpx
import numpy as np

from ..common.cluster.redis_access import RedisPassword, connect_redis
from ..common.errors import G2RPOError
from .discovery import live_replicas
from .request_chunks import (
    Batch,
    Refused,
    SentRequest,
    chunk_ranges,
    images_per_request,
    merge_responses,
    prompt_bytes,
    server_limit,
)
from .schemas import SAFETENSORS_TYPE, ScoreRequest, ScoreResponse
from .tls import client_verify, require_https, untrusted_server, unverified_certificate
from .wire import encode_safetensors

log = logging.getLogger(__name__)


class NoReplicaAvailable(G2RPOError, RuntimeError):
    """No live replica answered before the deadline."""


class RewardRequestError(G2RPOError, ValueError):
    """The server rejected the request itself (4xx): retrying elsewhere cannot help."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"reward server answered {status}: {detail}")
        self.status = status
        self.detail = detail

    def __reduce__(self):
        # rebuilt from (status, detail), not from its message: Ray sends a worker's
        # exception to the driver pickled, and without this it arrived as
        # "UnserializableException: Failed to deserialize exception"
        return type(self), (self.status, self.detail)


class RewardClient:
    def __init__(
        self,
        urls: list[str] | None = None,
        *,
        redis_url: str | None = None,
        redis_password: RedisPassword | None = None,
        token: str | None = None,
        ca_file: str | None = None,
        timeout_s: float = 60.0,
        deadline_s: float = 300.0,
        backoff_s: float = 0.1,
        cooldown_s: float = 5.0,
        request_bytes: int = 32 * 2**20,
        concurrency: int = 4,
    ) -> None:
        if not urls and not redis_url:
            raise ValueError("RewardClient needs urls or redis_url")
        if request_bytes < 1 or concurrency < 1:
            raise ValueError(
                f"RewardClient: request_bytes ({request_bytes}) and concurrency "
                f"({concurrency}) must be at least 1"
            )
        self.static = [u.rstrip("/") for u in urls or []]
        self.redis = None
        if redis_url:
            self.redis = connect_redis(redis_url, redis_password)
        self.token = token
        # https:// replicas are verified against this bundle (None: the system's CAs); with
        # one, plain http:// replicas are not used: a forged registration in Redis must not
        # get the token and images in clear
        self._verify = client_verify(ca_file)
        self.https_only = ca_file is not None
        if self.https_only:
            require_https(self.static, "train.reward.urls")
        self._skipped_plain: set[str] = set()
        self.timeout_s, self.deadline_s = timeout_s, deadline_s
        self.backoff_s, self.cooldown_s = backoff_s, cooldown_s
        self.request_bytes, self.concurrency = request_bytes, concurrency
        # the smallest body limit a server has named in a 413: later batches are cut to
        # it at once instead of being refused and halved again each time
        self.server_limit_bytes: int | None = None
        # the bodies the last score call sent (of calls running at once, the last to end)
        self.last_requests: list[SentRequest] = []
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
        return httpx.AsyncClient(timeout=self.timeout_s, headers=headers, verify=self._verify)

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
            if self.https_only:
                live = self._over_tls(live)
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

    def _over_tls(self, live: list) -> list:
        """The https:// replicas of ``live``; each plain one is said once and skipped."""
        for r in live:
            if not r.url.startswith("https://") and r.url not in self._skipped_plain:
                self._skipped_plain.add(r.url)
                log.warning(
                    "reward replica %s registered at %s is skipped: train.reward.tls_ca_file "
                    "is set, so the token and images go to https:// replicas only",
                    r.replica,
                    r.url,
                )
        return [r for r in live if r.url.startswith("https://")]

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
        embed: list[str] = (),
    ) -> concurrent.futures.Future:
        """Score in the background; the future resolves to a ScoreResponse (with the
        image embeddings of the scorers in ``embed``: reward_server/embeddings.py)."""
        return asyncio.run_coroutine_threadsafe(
            self.score_async(images, prompts, scorers, request_id, embed), self._loop
        )

    def score(
        self,
        images: np.ndarray,
        prompts: list[str],
        scorers: list[str],
        request_id: str | None = None,
        embed: list[str] = (),
    ) -> ScoreResponse:
        return self.submit(images, prompts, scorers, request_id, embed).result()

    def request_limit(self) -> int:
        """The body size requests are cut to: ours, or a server's if it named a lower one."""
        return min(self.request_bytes, self.server_limit_bytes or self.request_bytes)

    async def score_async(
        self,
        images: np.ndarray,
        prompts: list[str],
        scorers: list[str],
        request_id: str | None = None,
        embed: list[str] = (),
    ) -> ScoreResponse:
        """One ScoreResponse for the whole batch, sent as requests of at most
        ``request_bytes`` (see the module's docstring); ``last_requests`` then lists
        the bodies sent."""
        arr = np.asarray(images)
        if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[-1] != 3:
            raise ValueError(
                f"images must be uint8 [N, H, W, 3], got {arr.dtype} {list(arr.shape)}"
            )
        if len(prompts) != arr.shape[0]:  # checked here: chunks would hide a surplus prompt
            raise RewardRequestError(
                422, f"prompts: {len(prompts)} prompts for {arr.shape[0]} images"
            )
        batch = Batch(
            arr,
            list(prompts),
            list(scorers),
            request_id,
            prompt_bytes(prompts),
            # per call: concurrent calls (g2rpo bench reward's simulated clients) are not
            # queued behind each other
            asyncio.Semaphore(self.concurrency),
            list(embed),
        )
        sent: list[SentRequest] = []
        try:
            parts = await self._score_ranges(batch, self._ranges(batch, 0, len(arr)), sent)
        finally:
            self.last_requests = sorted(sent, key=lambda r: r.first)
        return merge_responses(parts, request_id)

    def _ranges(self, batch: Batch, lo: int, hi: int, at_most: int | None = None):
        per = images_per_request(batch.image_bytes, batch.prompt_bytes, self.request_limit())
        if at_most is not None:
            per = min(per, at_most)
        return [(lo + a, lo + b) for a, b in chunk_ranges(hi - lo, per)]

    async def _score_ranges(self, batch, ranges, sent) -> list[ScoreResponse]:
        """The ranges' answers in order, scored concurrently; the first failure cancels
        the rest (they would only be thrown away)."""
        if len(ranges) == 1:
            return await self._score_range(batch, *ranges[0], sent)
        tasks = [asyncio.ensure_future(self._score_range(batch, lo, hi, sent)) for lo, hi in ranges]
        try:
            answered = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return [part for parts in answered for part in parts]

    async def _score_range(self, batch, lo: int, hi: int, sent) -> list[ScoreResponse]:
        """Images ``[lo, hi)`` in one request, or, refused as too large, in halves."""
        async with batch.slots:  # released before splitting: the halves need slots too
            # encoded here, per chunk and off the event loop: the whole batch never is
            body = await asyncio.to_thread(encode_safetensors, batch.images[lo:hi])
            chunk_id = batch.request_id if batch.whole(lo, hi) else batch.chunk_id(lo, hi)
            header = ScoreRequest(
                scorers=batch.scorers,
                prompts=batch.prompts[lo:hi],
                request_id=chunk_id,
                embed=batch.embed,
            )
            answer = await self._send(header, body, lo, hi - lo, sent)
        if isinstance(answer, ScoreResponse):
            return [answer]
        if hi - lo == 1:
            raise RewardRequestError(413, self._one_image_refused(batch, answer))
        if answer.url is not None:  # a server's 413 (else our own estimate fell short)
            limit = server_limit(answer.detail)
            if limit is not None:
                self.server_limit_bytes = min(limit, self.server_limit_bytes or limit)
            log.warning(
                "reward request of %d images (%d bytes) refused as too large by %s (%s): "
                "sent again in smaller requests; set train.reward.request_mib below the "
                "server's limit to spare the refused ones",
                hi - lo,
                answer.body_bytes,
                answer.url,
                answer.detail,
            )
        # halves at least; smaller at once when the server named its limit
        return await self._score_ranges(
            batch, self._ranges(batch, lo, hi, math.ceil((hi - lo) / 2)), sent
        )

    def _one_image_refused(self, batch: Batch, refused: Refused) -> str:
        _, height, width, _ = batch.images.shape
        return (
            f"the reward server at {refused.url} refuses even one image of {height}x{width} "
            f"({refused.body_bytes} bytes as a request): {refused.detail}. Raise the server's "
            "limit (g2rpo reward-server --max-payload-mib; train.reward.max_payload_mib for "
            "the replicas a job starts) above one image; train.reward.request_mib "
            f"({self.request_bytes / 2**20:g} MiB) only bounds how much one request holds"
        )

    async def _send(
        self, header: ScoreRequest, body: bytes, first: int, count: int, sent: list
    ) -> ScoreResponse | Refused:
        """One request, retried with backoff and failed over until a replica answers or
        the deadline passes (counted from its first try)."""
        deadline = time.monotonic() + self.deadline_s
        backoff, last_error = self.backoff_s, "no replica registered"
        size, status = None, None
        try:
            while True:
                candidates = await asyncio.to_thread(self.replicas, list(header.scorers))
                for url in candidates:
                    request = self._http.build_request(
                        "POST",
                        f"{url}/v1/score",
                        # defaults left out: a server of before `embed` reads it
                        data={"request": header.model_dump_json(exclude_defaults=True)},
                        files={"images": ("batch.safetensors", body, SAFETENSORS_TYPE)},
                    )
                    length = int(request.headers["content-length"])
                    if length > self.request_limit() and count > 1:
                        # our estimate of the body was short: never send over the bound
                        return Refused(None, f"encoded body of {length} bytes", length)
                    size = length
                    self.attempts += 1
                    try:
                        response = await self._http.send(request)
                    except httpx.HTTPError as exc:  # refused, reset, timed out: fail over
                        reason = unverified_certificate(exc)
                        if reason is not None:  # a setting to fix: no replica would do better
                            raise untrusted_server(url, reason) from None
                        last_error = f"{url}: {type(exc).__name__}: {exc}"
                        self._mark_down(url)
                        continue
                    status = response.status_code
                    if status == 200:
                        return ScoreResponse.model_validate(response.json())
                    detail = _detail(response)
                    if status == 413:
                        return Refused(url, detail, size)
                    if status in (408, 429) or status >= 500:
                        last_error = f"{url}: {status} {detail}"
                        self._mark_down(url)
                        continue
                    raise RewardRequestError(status, detail)
                if time.monotonic() + backoff > deadline:
                    raise NoReplicaAvailable(
                        f"no reward replica answered within {self.deadline_s:.0f} s "
                        f"(last error: {last_error})"
                    )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
        finally:
            if size is not None:
                sent.append(SentRequest(first, count, size, status))

    def _mark_down(self, url: str) -> None:
        self.failovers += 1
        self._down[url] = time.monotonic() + self.cooldown_s


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail"))
    except Exception:
        return response.text[:200]
