"""The small named types that cross actor boundaries (driver ⇄ rollout workers,
learner ⇄ driver): what would otherwise travel as positional tuples. They are plain
frozen dataclasses because they carry object refs, layouts and image arrays, which
Ray pickles as they are."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cluster.redis_access import RedisPassword


@dataclass(frozen=True)
class RewardEndpoints:
    """Where a worker sends its images: static replica URLs (and the job's replicas),
    a Redis to discover more in (and its password), the bearer token, and the scorers
    to ask for."""

    urls: list[str]
    redis_url: str | None = None
    token: str | None = field(default=None, repr=False)  # never in a log line
    scorers: list[str] = field(default_factory=list)
    # train.reward.redis_password_env's value, read by the driver: in memory, never a URL
    redis_password: RedisPassword | None = field(default=None, repr=False)


@dataclass(frozen=True)
class WeightsLoaded:
    """A worker's answer after loading a published version: what it now holds
    (compared with what was published) and the seconds its fetch, verification and
    load took (not the time it waited for a rollout in progress)."""

    version: int
    checksum: str
    seconds: float = 0.0

    def holds(self, version: int, checksum: str) -> bool:
        return (self.version, self.checksum) == (version, checksum)


@dataclass(frozen=True)
class PublishedWeights:
    """Learner rank 0's new version: its label and checksum, its size on the wire,
    the seconds rank 0 spent producing it (gather, cast, hash, put), and how a worker
    gets it — an object-store ref (``object_store``) or the bucket layout of the
    broadcast (``collective``)."""

    version: int
    checksum: str
    nbytes: int
    seconds: float
    ref: Any = None  # ray.ObjectRef of the state dict
    layout: Any = None  # common.wire.weight_sync.Layout


@dataclass(frozen=True)
class EvalSamples:
    """An evaluator's held-out samples of one version: uint8 images [N, H, W, 3],
    scores per scorer (one per image), the seconds sampling and scoring took, and
    the weights version that sampled them (the driver checks it is the one it meant);
    the image-health measures of every image (``common/health/image_health.py``) and its
    16×16 thumbnail [N, 16, 16, 3], from which the driver measures it against the base;
    the unit image embeddings of every image, float16 [N, D], by the scorer named
    ``embedding_scorer`` (None when no scorer of the evaluation has them), from which the
    driver measures ``diversity_embed`` (``common/health/embedding_diversity.py``)."""

    images: np.ndarray
    scores: dict[str, list[float]]
    seconds: float
    version: int
    health: dict[str, list[float]] = field(default_factory=dict)
    thumbnails: np.ndarray | None = None
    embeddings: np.ndarray | None = None
    embedding_scorer: str | None = None
