"""The doctor's ``host copy`` phase: this node's host<->device copy rate, both
directions, from pinned host memory (what the colocated pair's offload moves through:
``common/cluster/time_sharing.HostMirror``) and from pageable memory (what a plain ``.to`` or
``.cpu()`` copies through), as calibration rows (``host_copy_gbps``, the rate the time
estimate divides the offloads' bytes by). It runs where there is a device beside the
host (on the CPU there is no such copy)."""

from __future__ import annotations

import time

import torch

GB = 1e9
CUDA_BYTES = 1 << 30  # a copy long enough that its launch costs nothing
OTHER_BYTES = 16 << 20  # the stand-in accelerator of the CPU tests copies host memory


def _seconds(copy, device: torch.device, repeats: int) -> float:
    """The fastest of ``repeats`` timed copies, after one untimed."""
    copy()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        copy()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


def host_copy_rates(device: str | torch.device, nbytes: int | None = None, repeats: int = 3):
    """GB/s of ``nbytes`` copied device->host and host->device, from pinned host memory
    (CUDA only: pinning needs it) and pageable memory: ``{"pinned": {"d2h": .., "h2d": ..},
    "pageable": {...}}``."""
    device = torch.device(device)
    if nbytes is None:
        nbytes = CUDA_BYTES if device.type == "cuda" else OTHER_BYTES
    kinds = ["pageable", *(["pinned"] if device.type == "cuda" else [])]
    return {kind: _rates(device, nbytes, kind == "pinned", repeats) for kind in kinds}


def _rates(device: torch.device, nbytes: int, pinned: bool, repeats: int) -> dict[str, float]:
    on_device = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(2)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned).fill_(1)
    d2h = _seconds(lambda: host.copy_(on_device, non_blocking=pinned), device, repeats)
    h2d = _seconds(lambda: on_device.copy_(host, non_blocking=pinned), device, repeats)
    return {"d2h": round(nbytes / GB / d2h, 3), "h2d": round(nbytes / GB / h2d, 3)}


def offload_kind(rates: dict) -> str:
    """The copies the offload makes: pinned where there is pinned memory."""
    return "pinned" if "pinned" in rates else "pageable"


def host_copy_phase(doctor) -> None:
    """The ``host copy`` phase (``g2rpo doctor``, any device but the CPU)."""
    device = torch.device(doctor.cfg.model.device)
    with doctor.phase("host copy") as r:
        if r is not None:
            nbytes = CUDA_BYTES if device.type == "cuda" else OTHER_BYTES
            rates = host_copy_rates(device, nbytes)
            r.details = {"bytes": nbytes, "gbps": rates, "offload_copies": offload_kind(rates)}
