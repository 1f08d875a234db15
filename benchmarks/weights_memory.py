"""``g2rpo bench weights-memory``: what a weight version costs each worker's host memory
as it loads it from the object store, with the version as NumPy arrays (what the
learner publishes: ``common/wire/weights.publishable``) or, ``pickled``, as torch tensors
(before: each worker unpickled a private copy).

One node, a local Ray of its own (or the one this process already joined): a
publisher (this process) puts one bf16 version of ``nbytes``, shaped like FLUX's
weights (many 3072 x 3072 matrices, small norms); two worker actors, each holding a
module of that version's shapes with every page already written (as a worker's
transformer is), verify its checksum and load it (``common/wire/weights.load_published``)
at the same time. While they do, this process samples each worker's
``/proc/PID/status`` every millisecond:

* ``RssAnon``: the worker's private (anonymous) pages. Its peak less its value before
  the load is the private growth: a private copy of the version shows here.
* ``RssShmem``: shared-memory pages the worker maps and has touched: Ray's object
  store is a file on /dev/shm (tmpfs), so the pages of the version it reads count
  here, once per node however many workers map them. ``RssFile``: the same, where the
  store is a disk file (a /dev/shm too small for it).
* ``VmRSS`` is their sum, so RSS alone counts the shared version in every worker.
  ``VmHWM`` (peak RSS, reset by writing 5 to ``/proc/self/clear_refs`` before the
  load) is reported beside: its growth is private + shared pages.

The publisher's own private growth while putting is sampled the same way (a torch
tensor is pickled in-band: a buffer of the whole version before the store's copy).
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

import ray
import torch

from ..common.cluster.process_memory import PeakSampler, read_status
from ..common.cluster.ray_init import init_ray
from ..common.errors import UsageError
from ..common.wire.weights import load_published, publishable, state_nbytes, weights_checksum

MiB = 2**20
SIDE = 3072  # FLUX.1-dev's hidden size: most of its bytes are 3072-wide matrices


def version_shapes(nbytes: int) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of a bf16 version of about ``nbytes``: SIDE x SIDE matrices (a
    last, shorter one makes up the rest), each with a SIDE-long norm beside it."""
    row = SIDE * 2
    rows = max(1, nbytes // row)
    shapes: dict[str, tuple[int, ...]] = {}
    i = 0
    while rows > 0:
        take = min(SIDE, rows)
        shapes[f"blocks.{i}.weight"] = (take, SIDE)
        shapes[f"blocks.{i}.norm"] = (SIDE,)
        rows -= take
        i += 1
    return shapes


def version_state(shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """A version with every byte written (a distinct value per tensor: cheap to fill,
    and no page left to the kernel's zero page)."""
    return {
        name: torch.full(shape, 0.001 * i, dtype=torch.bfloat16)
        for i, (name, shape) in enumerate(shapes.items())
    }


class _Block(torch.nn.Module):
    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        # filled, not zeros: calloc'd pages would become private only at the load
        self.weight = torch.nn.Parameter(torch.empty(shape, dtype=torch.bfloat16).fill_(-1), False)
        self.norm = torch.nn.Parameter(torch.empty(SIDE, dtype=torch.bfloat16).fill_(-1), False)


class _Weights(torch.nn.Module):
    """A worker's transformer stand-in: the version's names and shapes."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        super().__init__()
        mats = [shape for name, shape in shapes.items() if name.endswith(".weight")]
        self.blocks = torch.nn.ModuleList(_Block(shape) for shape in mats)


@ray.remote(num_cpus=0)
class _Worker:
    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        torch.set_num_threads(1)
        self.module = _Weights(shapes)

    def pid(self) -> int:
        return os.getpid()

    def before(self) -> dict[str, Any]:
        """Settled and measured; VmHWM reset to the current RSS where the kernel lets
        a process do so (``clear_refs``)."""
        gc.collect()
        reset = True
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            reset = False
        return {**read_status(), "hwm_reset": reset}

    def load(self, state: dict, checksum: str) -> float:
        """As ``RolloutWorkerCore.load_weights``: verify, then copy into the weights."""
        t0 = time.perf_counter()
        load_published(self.module, 1, state, checksum, lora=False)
        return time.perf_counter() - t0

    def after(self) -> dict[str, int]:
        return read_status()

    def loaded_matches(self, checksum: str) -> bool:
        return weights_checksum(self.module.state_dict()) == checksum


def _store_bytes(nbytes: int) -> int:
    """An object store that holds the version, with room for Ray's own objects."""
    return int(nbytes * 1.25) + 256 * MiB


def bench_weights_memory(nbytes: int, pickled: bool = False, workers: int = 2) -> dict:
    """Each worker's host-memory growth while it loads one version of ``nbytes`` (see
    the module's docstring); ``pickled``: the version put as torch tensors."""
    if nbytes < MiB:
        raise UsageError(f"--gib: a version of at least 1 MiB, got {nbytes} bytes")
    if workers < 1:
        raise UsageError(f"--workers: at least 1, got {workers}")
    started = not ray.is_initialized()
    if started:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        init_ray(
            num_cpus=workers + 1,
            include_dashboard=False,
            log_to_driver=False,
            object_store_memory=_store_bytes(nbytes),
        )
    try:
        return _measure(nbytes, pickled, workers)
    finally:
        if started:
            ray.shutdown()


def _measure(nbytes: int, pickled: bool, workers: int) -> dict:
    shapes = version_shapes(nbytes)
    actors = [_Worker.remote(shapes) for _ in range(workers)]
    try:
        pids = ray.get([a.pid.remote() for a in actors])
        state = version_state(shapes)
        size, checksum = state_nbytes(state), weights_checksum(state)
        gc.collect()
        put_before = read_status()
        with PeakSampler(["self"]) as put_sampler:
            t0 = time.perf_counter()
            ref = ray.put(state if pickled else publishable(state))
            put_s = time.perf_counter() - t0
        del state  # the store's copy is the version now, as after Learner.publish
        gc.collect()
        befores = ray.get([a.before.remote() for a in actors])
        with PeakSampler(pids) as sampler:
            t0 = time.perf_counter()
            seconds = ray.get([a.load.remote(ref, checksum) for a in actors])
            wall_s = time.perf_counter() - t0
        afters = ray.get([a.after.remote() for a in actors])
        if not all(ray.get([a.loaded_matches.remote(checksum) for a in actors])):
            raise RuntimeError("a worker's weights are not the published version after loading")
        per_worker = [
            _growth(size, before, sampler.peaks[pid], after, s)
            for pid, before, after, s in zip(pids, befores, afters, seconds, strict=True)
        ]
        publisher = put_sampler.peaks["self"]["RssAnon"] - put_before["RssAnon"]
        return {
            "path": "pickled torch tensors" if pickled else "zero-copy NumPy arrays",
            "pickled": pickled,
            "version_bytes": size,
            "version_mib": round(size / MiB, 1),
            "tensors": len(shapes),
            "workers": per_worker,
            "worst_private_fraction": max(w["private_fraction"] for w in per_worker),
            "load_wall_s": round(wall_s, 3),
            "put_s": round(put_s, 3),
            "publisher_private_growth_mib": round(publisher / MiB, 1),
        }
    finally:
        for a in actors:
            ray.kill(a)


def _growth(size: int, before: dict, peak: dict, after: dict, seconds: float) -> dict:
    private = peak["RssAnon"] - before["RssAnon"]
    shared = peak["RssShmem"] - before["RssShmem"]
    out = {
        "private_growth_mib": round(private / MiB, 1),
        "private_fraction": round(private / size, 4),
        "shared_mapped_mib": round(shared / MiB, 1),
        "file_mapped_mib": round((peak["RssFile"] - before["RssFile"]) / MiB, 1),
        "rss_growth_mib": round((peak["VmRSS"] - before["VmRSS"]) / MiB, 1),
        "load_s": round(seconds, 3),
    }
    if before.get("hwm_reset"):
        out["hwm_growth_mib"] = round((after["VmHWM"] - before["VmRSS"]) / MiB, 1)
    return out


def format_memory(result: dict) -> str:
    r = result
    lines = [
        f"{r['path']}: a {r['version_mib']:.0f} MiB bf16 version ({r['tensors']} tensors) "
        f"loaded by {len(r['workers'])} workers on this node (put {r['put_s']:.2f} s, loads "
        f"{r['load_wall_s']:.2f} s); the publisher's private growth while putting "
        f"{r['publisher_private_growth_mib']:.0f} MiB",
        "  per worker, peak growth during the load (/proc/PID/status, sampled every ms):",
    ]
    for i, w in enumerate(r["workers"]):
        hwm = f", VmHWM +{w['hwm_growth_mib']:.0f}" if "hwm_growth_mib" in w else ""
        lines.append(
            f"    worker {i}: private (RssAnon) +{w['private_growth_mib']:.0f} MiB "
            f"= {w['private_fraction']:.1%} of the version; shared store pages mapped "
            f"(RssShmem) +{w['shared_mapped_mib']:.0f} MiB, file-backed (RssFile) "
            f"+{w['file_mapped_mib']:.0f}; RSS +{w['rss_growth_mib']:.0f}{hwm}; "
            f"load {w['load_s']:.2f} s"
        )
    lines.append(
        "  RSS counts the store's shared pages in every worker that maps them; the node "
        "holds them once (in /dev/shm)"
    )
    return "\n".join(lines)
