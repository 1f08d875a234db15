"""``g2rpo bench reward``: throughput and latency of real reward-server processes,
driven through the real client: 1/8/64 concurrent clients, batched vs
``--max-batch 1``, and 1 vs 2 replicas behind the client, all in one run."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import numpy as np

from ..reward_server.client import RewardClient
from ..reward_server.process import RewardServerProcess


def _server(scorer: str, max_batch: int, threads: int, device: str) -> RewardServerProcess:
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return RewardServerProcess(
        "--scorers",
        scorer,
        "--max-batch",
        str(max_batch),
        "--max-wait-ms",
        "10",
        "--device",
        device,
        env=env,
        quiet=True,
        ready=False,
    )


def _load(
    client: RewardClient,
    scorer: str,
    clients: int,
    duration_s: float,
    per_request: int,
    seed: int,
    side: int = 32,
) -> dict:
    """``clients`` concurrent loops, each sending its next request as soon as the last
    is answered; every image is new (no cache hits)."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 256, (64, side, side, 3), dtype=np.uint8)
    prompts = ["a red circle on a blue background"] * per_request

    async def run() -> list[float]:
        latencies: list[float] = []
        stop_at = time.perf_counter() + duration_s
        counter = iter(range(10**9))

        async def loop() -> None:
            while time.perf_counter() < stop_at:
                i = next(counter)
                imgs = pool[np.arange(i * per_request, (i + 1) * per_request) % len(pool)].copy()
                imgs[:, 0, 0, :] = np.frombuffer(np.int64(i).tobytes()[:3], np.uint8)  # unique
                start = time.perf_counter()
                await client.score_async(imgs, prompts, [scorer])
                latencies.append(time.perf_counter() - start)

        await asyncio.gather(*(loop() for _ in range(clients)))
        return latencies

    start = time.perf_counter()
    latencies = asyncio.run_coroutine_threadsafe(run(), client._loop).result()
    wall = time.perf_counter() - start
    lat = np.array(latencies) * 1000
    return {
        "clients": clients,
        "requests": len(latencies),
        "images_per_s": round(len(latencies) * per_request / wall, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 2),
        "p99_ms": round(float(np.percentile(lat, 99)), 2),
    }


def bench_reward(
    *,
    scorer: str = "shapes_clip",
    duration_s: float = 3.0,
    per_request: int = 2,
    clients: tuple[int, ...] = (1, 8, 64),
    seed: int = 0,
    device: str = "cpu",
    random_model: str | None = None,
    image_size: int = 32,
    threads: int | None = None,
) -> dict:
    """``scorer``: NAME or NAME=DIR; ``random_model`` (``vit-h-14``, ``tiny``) serves a
    random CLIP-family model of that size under NAME instead of a checkpoint;
    ``threads``: torch threads of the single server (default: every core; each of the
    two replicas gets half)."""
    import tempfile

    name = scorer.partition("=")[0]
    with tempfile.TemporaryDirectory() as tmp:
        if random_model:
            from ..reward_server.random_models import random_clip_dir

            scorer = f"{name}={random_clip_dir(Path(tmp) / random_model, random_model)}"
        results = _measure(
            scorer, name, duration_s, per_request, clients, seed, device, image_size, threads
        )
    results.update(device=device, random_model=random_model, image_size=image_size)
    return results


def _measure(scorer, name, duration_s, per_request, clients, seed, device, side, threads) -> dict:
    results: dict = {
        "scorer": name,
        "images_per_request": per_request,
        "duration_s": duration_s,
        "batched": [],
        "unbatched": [],
        "replicas": {},
    }
    threads = threads or max(1, (os.cpu_count() or 2))
    results["threads"] = threads
    load = dict(per_request=per_request, seed=seed, side=side)
    # every server starts at once (their start is mostly imports, idle once up); one
    # replica is the batched server itself, as it has the same settings
    batched, unbatched = (_server(scorer, b, threads, device) for b in (64, 1))
    pair = [_server(scorer, 64, max(1, threads // 2), device) for _ in range(2)]
    everyone = [batched, unbatched, *pair]
    try:
        for server in everyone:
            server.wait_ready()
        for key, server in (("batched", batched), ("unbatched", unbatched)):
            with RewardClient([server.url], deadline_s=600) as client:
                _load(client, name, 4, 1.0, **load)  # warm-up
                for c in clients:
                    results[key].append(_load(client, name, c, duration_s, **load))
        top = max(clients)
        for replicas, servers in (("1", [batched]), ("2", pair)):
            with RewardClient([s.url for s in servers], deadline_s=600) as client:
                _load(client, name, 4, 1.0, **load)
                results["replicas"][replicas] = _load(client, name, top, duration_s, **load)
    finally:
        for server in everyone:
            server.kill()
    b = {r["clients"]: r for r in results["batched"]}
    u = {r["clients"]: r for r in results["unbatched"]}
    results["batching_gain"] = round(b[top]["images_per_s"] / u[top]["images_per_s"], 2)
    results["p99_ms_batched"] = b[top]["p99_ms"]
    results["replica_gain"] = round(
        results["replicas"]["2"]["images_per_s"] / results["replicas"]["1"]["images_per_s"], 2
    )
    results["cpu_count"] = os.cpu_count()
    return results
