"""How a score call's batch goes as several requests of at most ``request_bytes`` each:
the arithmetic of cutting it into chunks (``images_per_request``, ``chunk_ranges``),
the batch its chunks share, what each request sent (``SentRequest``) or had refused as
too large, and ``merge_responses``, which joins the chunks' answers back into one.
reward_server/client.py sends them."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import math
import re

import numpy as np

from .embeddings import merge_embeddings
from .schemas import ScoreResponse

log = logging.getLogger(__name__)

# What a request body holds besides its images and prompts: the multipart boundaries
# and part headers, the safetensors header, the scorer names and the request id (about
# 500 bytes; a body that still comes out over the bound is split before it is sent).
HEADER_ALLOWANCE_BYTES = 16 * 2**10


@dataclasses.dataclass(frozen=True)
class SentRequest:
    """One request body a ``score`` call sent (retries of the same body count once)."""

    first: int  # index of its first image in the batch
    images: int
    body_bytes: int
    status: int | None  # HTTP status of its last answer; None: no replica answered


def prompt_bytes(prompts: list[str]) -> int:
    """Upper bound of one prompt's share of the request JSON: the longest prompt as
    ASCII-escaped JSON (never shorter than its UTF-8), plus its separator."""
    return max((len(json.dumps(p)) + 1 for p in prompts), default=0)


def images_per_request(
    image_bytes: int,
    prompt_bytes: int,
    request_bytes: int,
    header_bytes: int = HEADER_ALLOWANCE_BYTES,
) -> int:
    """How many images (with their prompts) one request body of at most
    ``request_bytes`` holds; at least one, since an image cannot be cut."""
    return max(1, (request_bytes - header_bytes) // max(1, image_bytes + prompt_bytes))


def chunk_ranges(count: int, per_request: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` ranges covering ``range(count)`` in order: as few as ``per_request``
    images per range allows, their sizes within one of each other (so concurrent
    requests finish together). An empty batch is one empty range: one request."""
    chunks = max(1, math.ceil(count / max(1, per_request)))
    bounds = [count * k // chunks for k in range(chunks + 1)]
    return list(itertools.pairwise(bounds))


def merge_responses(parts: list[ScoreResponse], request_id: str | None) -> ScoreResponse:
    """The answer one request for the whole batch would have had, from the answers of
    its chunks in batch order: scores concatenated; ``cached`` (images answered from
    the cache) summed; ``timings_ms`` summed (server time spent on the batch, not wall
    time: the chunks ran concurrently); distinct versions and replicas joined by ",",
    in order of first appearance (one version each, unless replicas disagree)."""
    if len(parts) == 1:
        return parts[0].model_copy(update={"request_id": request_id})
    scorers = list(parts[0].scores)
    timings: dict[str, float] = {}
    for part in parts:
        for key, ms in part.timings_ms.items():
            timings[key] = timings.get(key, 0.0) + ms
    versions = {n: _joined(p.versions[n] for p in parts) for n in scorers}
    for name, version in versions.items():
        if "," in version:
            log.warning("replicas scored %s with different versions: %s", name, version)
    return ScoreResponse(
        request_id=request_id,
        scores={n: [s for p in parts for s in p.scores[n]] for n in scorers},
        versions=versions,
        cached={n: sum(p.cached[n] for p in parts) for n in scorers},
        timings_ms=timings,
        replica=_joined(p.replica for p in parts),
        embeddings=merge_embeddings([p.embeddings for p in parts]),
    )


def _joined(values) -> str:
    return ",".join(dict.fromkeys(values))


def server_limit(detail: str) -> int | None:
    """The body limit a server's 413 names (``request body exceeds N bytes``), if any."""
    found = re.search(r"exceeds (\d+) bytes", detail)
    return int(found.group(1)) if found else None


@dataclasses.dataclass
class Refused:
    """A chunk the server refused as too large (413), or that came out over our own
    bound once encoded: split it."""

    url: str | None
    detail: str
    body_bytes: int


@dataclasses.dataclass
class Batch:
    """What one score call scores, shared by its chunks."""

    images: np.ndarray
    prompts: list[str]
    scorers: list[str]
    request_id: str | None
    prompt_bytes: int
    slots: asyncio.Semaphore  # requests of this call in flight
    embed: list[str] = dataclasses.field(default_factory=list)  # scorers to embed with

    @property
    def image_bytes(self) -> int:
        return math.prod(self.images.shape[1:])

    def whole(self, lo: int, hi: int) -> bool:
        return lo == 0 and hi == len(self.images)

    def chunk_id(self, lo: int, hi: int) -> str | None:
        """The request id of images ``[lo, hi)``: the batch's, suffixed with the range."""
        return None if self.request_id is None else f"{self.request_id}/{lo}-{hi}"
