"""Score cache keyed by (scorer, version, image hash, prompt): a retried request is
answered without scoring again, so retries and failovers are idempotent."""

from __future__ import annotations

import hashlib

import numpy as np
from cachetools import LRUCache


def cache_keys(scorer: str, version: str, images: np.ndarray, prompts: list[str]) -> list[str]:
    keys = []
    for img, prompt in zip(images, prompts, strict=True):
        h = hashlib.sha256()
        h.update(str(img.shape).encode())
        h.update(np.ascontiguousarray(img).tobytes())
        h.update(b"\0")
        h.update(prompt.encode("utf-8"))
        keys.append(f"g2rpo:score:{scorer}:{version}:{h.hexdigest()}")
    return keys


class MemoryCache:
    """In-process LRU (one replica without Redis); ``capacity`` 0 keeps nothing."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._data: LRUCache[str, float] | None = LRUCache(capacity) if capacity > 0 else None

    def get_many(self, keys: list[str]) -> list[float | None]:
        if self._data is None:
            return [None] * len(keys)
        return [self._data.get(k) for k in keys]  # a hit becomes the most recent

    def set_many(self, items: dict[str, float]) -> None:
        if self._data is not None:
            self._data.update(items)  # beyond capacity, the least recently used go


class RedisCache:
    """Shared by every replica on one Redis; entries expire after ``ttl_s``."""

    def __init__(self, client, ttl_s: int = 24 * 3600) -> None:
        self.client = client
        self.ttl_s = ttl_s

    def get_many(self, keys: list[str]) -> list[float | None]:
        if not keys:
            return []
        return [None if v is None else float(v) for v in self.client.mget(keys)]

    def set_many(self, items: dict[str, float]) -> None:
        if not items:
            return
        pipe = self.client.pipeline(transaction=False)
        for k, v in items.items():
            pipe.set(k, repr(float(v)), ex=self.ttl_s)
        pipe.execute()
