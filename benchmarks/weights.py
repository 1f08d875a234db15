"""``g2rpo bench weights``: what publishing one weight version costs, by both
transports of training (``train.weights.transport``): the object store (the learner
takes its trained state and puts it once; every worker fetches it, verifies the
checksum and loads it strictly into its transformer) and the collective (the
learner packs it into buckets and broadcasts them over the weight group; every
worker unpacks, verifies and loads), against the floor: one ``ray.put`` +
``ray.get`` of the same bytes to one worker. Full weights (float32, and bfloat16 as
``model.rollout_weights_dtype`` publishes them) and LoRA adapters, for each model
size and each number of workers. On the Ray cluster RAY_ADDRESS names, else on a
local one of its own."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import ray
import torch

from ..common.algorithms.flops import best_seconds
from ..common.cluster.net import free_address
from ..common.cluster.ray_init import init_ray
from ..common.config.model import LoraOptions
from ..common.errors import UsageError
from ..common.families.flux import build_tiny_flux, count_parameters, tiny_flux_config
from ..common.families.lora import add_lora
from ..common.wire.weight_sync import WeightGroup, layout_of
from ..common.wire.weights import load_published, publishable, state_nbytes, weights_checksum
from ..learner.trainer import in_rollout_dtype, trained_state

MODES = {  # mode: (LoRA, dtype the workers hold)
    "full": (False, torch.float32),
    "full_bf16": (False, torch.bfloat16),
    "lora": (True, torch.float32),
}


def _model(size: str, lora_rank: int | None, device: str, dtype=torch.float32):
    transformer = build_tiny_flux(size, seed=0).to(device)
    if lora_rank:
        add_lora(transformer, LoraOptions(rank=lora_rank, alpha=2.0 * lora_rank), seed=1)
    return transformer.to(dtype) if dtype != torch.float32 else transformer


class _Member:
    """Stand-in learner or worker: a transformer of each mode in turn (``use``), and
    the weight group's side (joined once, whatever the mode)."""

    def __init__(self, size: str, lora_rank: int, device: str, worker: bool):
        torch.set_num_threads(1)
        self.size, self.lora_rank, self.device, self.worker = size, lora_rank, device, worker
        self.group = None

    def use(self, mode: str) -> None:
        lora, dtype = MODES[mode]
        self.lora, self.dtype = lora, dtype
        rank = self.lora_rank if lora else None
        held = dtype if self.worker else torch.float32
        self.transformer = _model(self.size, rank, self.device, held)

    def address(self) -> str:
        return free_address()

    def join(self, address: str, rank: int, world: int) -> None:
        self.group = WeightGroup("bench", address, rank, world, self.device, timeout_s=300)


@ray.remote
class _Publisher(_Member):
    def _state(self):
        """As the learner: trained state in the workers' dtype, then its checksum."""
        state = in_rollout_dtype(trained_state(self.transformer, self.lora), self.dtype)
        return state, weights_checksum(state)

    def publish(self):
        """As Learner.publish: trained state → checksum → one object-store put."""
        state, checksum = self._state()
        return [ray.put(publishable(state))], checksum, state_nbytes(state)

    def stage(self):
        state, checksum = self._state()
        self.staged = state
        return layout_of(state), checksum

    def broadcast(self, layout) -> None:
        self.group.send(self.staged, layout)

    def put_raw(self, nbytes: int):
        """The floor: the same number of bytes as one array, put once (a worker maps
        it, as it maps a published version)."""
        return [ray.put(np.zeros(nbytes, dtype=np.uint8))]


@ray.remote
class _Subscriber(_Member):
    def load(self, refs, checksum: str) -> None:
        """As a rollout worker's load_weights: fetch, verify, load strictly."""
        load_published(self.transformer, 1, ray.get(refs[0]), checksum, self.lora)

    def receive(self, layout, checksum: str) -> None:
        """As a rollout worker's receive_weights: receive, verify, load strictly."""
        load_published(self.transformer, 1, self.group.receive(layout), checksum, self.lora)

    def fetch(self, refs) -> int:
        return int(ray.get(refs[0]).size)


def _start_members(size: str, workers: int, lora_rank: int, device: str):
    """A publisher and ``workers`` subscribers in one weight group, kept for every mode
    (an actor's start costs more than any test-size measurement)."""
    pub = _Publisher.remote(size, lora_rank, device, False)
    subs = [_Subscriber.remote(size, lora_rank, device, True) for _ in range(workers)]
    try:
        address = ray.get(pub.address.remote())
        ray.get(
            [pub.join.remote(address, 0, workers + 1)]
            + [s.join.remote(address, i + 1, workers + 1) for i, s in enumerate(subs)]
        )
    except BaseException:
        for actor in [pub, *subs]:
            ray.kill(actor)
        raise
    return pub, subs


def _one_setting(pub, subs, size: str, mode: str, lora_rank: int, repeats: int):
    workers = len(subs)
    ray.get([a.use.remote(mode) for a in [pub, *subs]])

    def object_store():
        refs, checksum, _ = ray.get(pub.publish.remote())
        ray.get([s.load.remote(refs, checksum) for s in subs])

    def collective():
        layout, checksum = ray.get(pub.stage.remote())
        ray.get([pub.broadcast.remote(layout)] + [s.receive.remote(layout, checksum) for s in subs])

    _, _, nbytes = ray.get(pub.publish.remote())

    def put_and_get():
        ray.get(subs[0].fetch.remote(ray.get(pub.put_raw.remote(nbytes))))

    store_s = best_seconds(object_store, repeats, warmup=True)
    bcast_s = best_seconds(collective, repeats, warmup=True)
    floor_s = best_seconds(put_and_get, repeats, warmup=True)
    lora, dtype = MODES[mode]
    return {
        "preset": size,
        "mode": mode,
        "workers": workers,
        "parameters": None if lora else count_parameters(build_tiny_flux(size)),
        "lora_rank": lora_rank if lora else None,
        "dtype": str(dtype).removeprefix("torch."),
        "bytes": nbytes,
        # significant digits: a test-size put+get takes well under a millisecond
        "publish_and_load_s": _sig(store_s),
        "broadcast_and_load_s": _sig(bcast_s),
        "put_get_one_worker_s": _sig(floor_s),
        "path_vs_floor": _sig(store_s / floor_s),
        "broadcast_vs_floor": _sig(bcast_s / floor_s),
        "broadcast_vs_object_store": _sig(bcast_s / store_s),
    }


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def bench_weights(
    *,
    sizes: list[str] | None = None,
    workers: list[int] | int = 2,
    lora_rank: int = 16,
    repeats: int = 3,
    device: str = "cpu",
    modes: list[str] | None = None,
) -> dict[str, Any]:
    sizes = sizes or ["test", "bench"]
    counts = [workers] if isinstance(workers, int) else list(workers)
    modes = modes or list(MODES)
    if not counts or min(counts) < 1:
        raise UsageError(f"workers {counts}: every count must be >= 1")
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise UsageError(f"modes {unknown}: choose from {sorted(MODES)}")
    for size in sizes:
        try:
            tiny_flux_config(size)
        except ValueError as exc:
            raise UsageError(f"--sizes: {exc}") from None
    started = not ray.is_initialized()
    if started:  # on the cluster a job would train on, else a local one
        if not os.environ.get("RAY_ADDRESS"):
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        init_ray(
            num_cpus=max(counts) + 1,
            include_dashboard=False,
            log_to_driver=False,
            object_store_memory=1024 * 2**20,
        )
    out: dict[str, Any] = {
        "settings": {"workers": counts, "repeats": repeats, "device": device, "modes": modes}
    }
    try:
        for size in sizes:
            for n in counts:
                pub, subs = _start_members(size, n, lora_rank, device)
                try:
                    for mode in modes:
                        result = _one_setting(pub, subs, size, mode, lora_rank, repeats)
                        out[f"{size}/{mode}/w{n}"] = result
                finally:
                    for actor in [pub, *subs]:
                        ray.kill(actor)
    finally:
        if started:
            ray.shutdown()
    return out
