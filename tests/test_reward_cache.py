"""The reward server's in-process score cache: least recently used entries go first."""

import numpy as np
from g2rpo.reward_server.cache import MemoryCache, cache_keys


def test_memory_cache_evicts_the_least_recently_used():
    cache = MemoryCache(capacity=2)
    cache.set_many({"a": 1.0, "b": 2.0})
    assert cache.get_many(["a", "b", "c"]) == [1.0, 2.0, None]
    cache.get_many(["a"])  # a read makes "a" the most recent: "b" goes next
    cache.set_many({"c": 3.0})
    assert cache.get_many(["a", "b", "c"]) == [1.0, None, 3.0]
    cache.set_many({"a": 1.5})  # overwriting keeps one entry per key
    assert cache.get_many(["a", "c"]) == [1.5, 3.0]


def test_memory_cache_of_capacity_zero_keeps_nothing():
    cache = MemoryCache(capacity=0)
    cache.set_many({"a": 1.0})
    assert cache.get_many(["a"]) == [None]


def test_keys_name_scorer_version_pixels_and_prompt():
    images = np.zeros((2, 4, 4, 3), np.uint8)
    images[1, 0, 0, 0] = 1
    keys = cache_keys("hpsv2", "v1", images, ["p", "p"])
    assert keys[0] != keys[1] and all(k.startswith("g2rpo:score:hpsv2:v1:") for k in keys)
    assert cache_keys("hpsv2", "v2", images, ["p", "p"])[0] != keys[0]
    assert cache_keys("hpsv2", "v1", images, ["q", "p"])[0] != keys[0]
