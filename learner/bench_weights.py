"""``g2rpo bench weights``: what publishing one weight version costs. The training
path (the learner takes its trained state and puts it once into the object store;
every worker fetches it, verifies the checksum and loads it strictly into its
transformer) against the floor: one ``ray.put`` + ``ray.get`` of the same bytes.
Full weights and LoRA adapters, for each model size, on N workers."""

from __future__ import annotations

import os
import time
from typing import Any

import ray
import torch

from ..common.config import LoraOptions
from ..common.flux import build_tiny_flux, count_parameters
from ..common.lora import add_lora
from ..rollout_worker.worker import load_published, weights_checksum
from .trainer import trained_state


def _model(size: str, lora_rank: int | None, device: str):
    transformer = build_tiny_flux(size, seed=0).to(device)
    if lora_rank:
        add_lora(transformer, LoraOptions(rank=lora_rank, alpha=2.0 * lora_rank), seed=1)
    return transformer


@ray.remote
class _Publisher:
    def __init__(self, size: str, lora_rank: int | None, device: str) -> None:
        torch.set_num_threads(1)
        self.transformer = _model(size, lora_rank, device)
        self.lora = bool(lora_rank)

    def publish(self):
        """As Learner.publish: trained state → checksum → one object-store put."""
        t0 = time.perf_counter()
        state = trained_state(self.transformer, self.lora)
        checksum = weights_checksum(state)
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        ref = ray.put(state)
        return [ref], checksum, nbytes, time.perf_counter() - t0

    def put_raw(self, nbytes: int):
        """The floor: the same number of bytes as one tensor, put once."""
        return [ray.put(torch.zeros(nbytes, dtype=torch.uint8))]


@ray.remote
class _Subscriber:
    def __init__(self, size: str, lora_rank: int | None, device: str) -> None:
        torch.set_num_threads(1)
        self.transformer = _model(size, lora_rank, device)
        self.lora = bool(lora_rank)

    def load(self, refs, checksum: str) -> float:
        """As a rollout worker's load_weights: fetch, verify, load strictly."""
        t0 = time.perf_counter()
        state = ray.get(refs[0])
        load_published(self.transformer, 1, state, checksum, self.lora)
        return time.perf_counter() - t0

    def fetch(self, refs) -> int:
        return int(ray.get(refs[0]).numel())


def _best(fn, repeats: int) -> float:
    fn()  # warm-up: first transfers map the object store
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bench_weights(
    *,
    sizes: list[str] | None = None,
    workers: int = 2,
    lora_rank: int = 16,
    repeats: int = 3,
    device: str = "cpu",
) -> dict[str, Any]:
    sizes = sizes or ["test", "bench"]
    started = not ray.is_initialized()
    if started:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        ray.init(
            num_cpus=workers + 1,
            include_dashboard=False,
            log_to_driver=False,
            object_store_memory=1024 * 2**20,
        )
    out: dict[str, Any] = {"settings": {"workers": workers, "repeats": repeats, "device": device}}
    try:
        for size in sizes:
            for mode, rank in (("full", None), ("lora", lora_rank)):
                pub = _Publisher.remote(size, rank, device)
                subs = [_Subscriber.remote(size, rank, device) for _ in range(workers)]

                def publish_and_load(pub=pub, subs=subs):
                    refs, checksum, _, _ = ray.get(pub.publish.remote())
                    ray.get([s.load.remote(refs, checksum) for s in subs])

                _, _, nbytes, _ = ray.get(pub.publish.remote())

                def put_and_get(pub=pub, sub=subs[0], nbytes=nbytes):
                    ray.get(sub.fetch.remote(ray.get(pub.put_raw.remote(nbytes))))

                path_s = _best(publish_and_load, repeats)
                floor_s = _best(put_and_get, repeats)
                params = count_parameters(build_tiny_flux(size)) if mode == "full" else None
                out[f"{size}/{mode}"] = {
                    "preset": size,
                    "mode": mode,
                    "parameters": params,
                    "lora_rank": rank,
                    "bytes": nbytes,
                    # significant digits: a test-size put+get takes well under a millisecond
                    "publish_and_load_s": float(f"{path_s:.4g}"),
                    "put_get_one_worker_s": float(f"{floor_s:.4g}"),
                    "path_vs_floor": float(f"{path_s / floor_s:.4g}"),
                }
                for actor in [pub, *subs]:
                    ray.kill(actor)
    finally:
        if started:
            ray.shutdown()
    return out
