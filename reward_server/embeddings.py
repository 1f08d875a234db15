"""Image embeddings beside the scores: a score request naming scorers in ``embed`` gets
each one's L2-normalised image features back (``ScoreResponse.embeddings``), float16 in
base64 (D = 512-1024: 1-2 KB an image), for measures that need to see content (an
evaluation's ``diversity_embed``, common/health/embedding_diversity.py).

Embeddings never pass through the score cache (it holds one float per image, prompt and
scorer version): an image is embedded each time it is asked for, on its scorer's thread
between batches. Only evaluations ask, a few hundred images each."""

from __future__ import annotations

import base64
import time

import numpy as np

from .scorers.base import BadInput, can_embed
from .scorers.registry import EMBEDDING_SCORERS

WIRE_DTYPE = np.dtype("<f2")


def encode_embeddings(features: np.ndarray):
    """float [N, D] -> EmbeddingPayload (float16, little-endian, base64)."""
    from .schemas import EmbeddingPayload

    arr = np.ascontiguousarray(features, dtype=WIRE_DTYPE)
    if arr.ndim != 2:
        raise ValueError(f"embeddings must be [N, D], got shape {list(arr.shape)}")
    text = base64.b64encode(arr.tobytes()).decode("ascii")
    return EmbeddingPayload(shape=list(arr.shape), base64=text)


def decode_embeddings(payload) -> np.ndarray:
    """EmbeddingPayload -> float16 [N, D]; a payload whose bytes do not fill its shape is
    refused naming it."""
    raw = base64.b64decode(payload.base64)
    count = int(np.prod(payload.shape))
    if len(payload.shape) != 2 or len(raw) != count * WIRE_DTYPE.itemsize:
        raise ValueError(
            f"embeddings: {len(raw)} bytes do not hold float16 of shape {payload.shape}"
        )
    return np.frombuffer(raw, dtype=WIRE_DTYPE).reshape(payload.shape).astype(np.float16)


def check_embeddable(names: list[str], batchers: dict) -> None:
    """422 (``BadInput`` naming ``embed``) for a scorer in ``embed`` without an image tower
    (the request's validation already keeps ``embed`` among the served ``scorers``)."""
    blind = [n for n in names if n in batchers and not can_embed(batchers[n].scorer)]
    if blind:
        able = sorted(n for n, b in batchers.items() if can_embed(b.scorer)) or "none"
        raise BadInput(
            f"embed: {blind} have no image embedding; of this replica's scorers these do: {able}"
        )


async def embed_images(batchers: dict, names: list[str], images: np.ndarray, timings: dict):
    """{name: EmbeddingPayload} of ``images`` for each scorer in ``names`` (None when
    none is named), each computed on its scorer's own thread; their seconds, in ms, as
    ``timings["embed"]``."""
    if not names:
        return None
    start = time.perf_counter()
    out = {}
    for name in names:
        scorer = batchers[name].scorer
        features = await batchers[name].call(scorer.embed, images)
        out[name] = encode_embeddings(features)
    timings["embed"] = (time.perf_counter() - start) * 1000
    return out


def merge_embeddings(parts: list[dict | None]) -> dict | None:
    """The embeddings of one batch from its chunks' answers, in order (None if any chunk
    has none: chunks of one call ask the same)."""
    if not parts or any(p is None for p in parts):
        return None
    return {
        name: encode_embeddings(np.concatenate([decode_embeddings(p[name]) for p in parts]))
        for name in parts[0]
    }


def response_embeddings(response, name: str) -> np.ndarray:
    """float16 [N, D]: the embeddings of scorer ``name`` in a ScoreResponse."""
    got = response.embeddings or {}
    if name not in got:
        raise ValueError(f"the reward server's answer has no embeddings of {name!r}")
    return decode_embeddings(got[name])


def embedding_scorer(scorers: list[str], trained: list[str]) -> str | None:
    """The scorer an evaluation takes its image embeddings from: the first of ``scorers``
    that has an image tower and is held out (not in ``trained``: a trained scorer's
    features are what the policy may have learned to please), else the first trained one
    that has; None when none has."""
    able = [s for s in scorers if s in EMBEDDING_SCORERS]
    held_out = [s for s in able if s not in trained]
    return (held_out or able or [None])[0]
