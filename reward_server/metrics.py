"""Prometheus metrics of one reward-server replica (own registry per app)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "g2rpo_reward_requests_total", "Score requests by HTTP status", ["status"], registry=r
        )
        self.request_seconds = Histogram(
            "g2rpo_reward_request_duration_seconds", "Score request latency", registry=r
        )
        self.images = Counter(
            "g2rpo_reward_images_scored_total", "Images scored (not cached)", ["scorer"], registry=r
        )
        self.cache_hits = Counter(
            "g2rpo_reward_cache_hits_total",
            "Images answered from the cache",
            ["scorer"],
            registry=r,
        )
        self.batch_size = Histogram(
            "g2rpo_reward_batch_size",
            "Images per scorer call",
            ["scorer"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batch_seconds = Histogram(
            "g2rpo_reward_batch_duration_seconds", "Scorer call latency", ["scorer"], registry=r
        )
        self.queue_depth = Gauge(
            "g2rpo_reward_queue_depth", "Images waiting for a scorer call", ["scorer"], registry=r
        )
        self.inflight = Gauge("g2rpo_reward_inflight_requests", "Requests in flight", registry=r)

    def on_batch(self, scorer: str, n: int, seconds: float) -> None:
        self.batch_size.labels(scorer).observe(n)
        self.batch_seconds.labels(scorer).observe(seconds)
        self.images.labels(scorer).inc(n)

    def on_depth(self, scorer: str, depth: int) -> None:
        self.queue_depth.labels(scorer).set(depth)
