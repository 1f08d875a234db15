"""``g2rpo bench ipc-handoff``: the colocated handoff's protocol (``common/wire/ipc_handoff.py``)
between two processes on one device, timed: a sender process holds a bfloat16 version of
``gib`` GiB on the device, hands it bucket by bucket to a receiver process (CUDA IPC
handles on a GPU, shared-memory handles on the CPU) whose own weights start as zeros;
the receiver copies each bucket out and acknowledges. Without Ray (the GPU node this is
for has none installed): the messages travel through a pipe, so the bytes that cross
between the processes are those the pipe carried, counted as they are pickled.

Reported: seconds and GiB/s of a whole handoff (the best of ``repeats``, after one that
maps the handles the first time), buckets, the bytes through host memory per handoff and
per GiB of version, what the device checksum costs the sender alone, and whether the
receiver's checksum and bytes equal the sender's."""

from __future__ import annotations

import multiprocessing as mp
import time

GiB = 2**30
WIDTH = 3072  # FLUX.1-dev's hidden size: tensors of WIDTH columns


def _shapes(gib: float, tensor_mib: int) -> list[tuple[int, int]]:
    rows = max(1, tensor_mib * 2**20 // (2 * WIDTH))
    count = max(1, round(gib * GiB / (rows * WIDTH * 2)))
    return [(rows, WIDTH)] * count


def _receiver(device: str, shapes: list, conn) -> None:
    """The rollout worker's process: zeros, filled only by what is handed over."""
    try:
        import torch

        from ..common.wire.ipc_handoff import BucketReceiver, device_identity
        from ..common.wire.weights import weights_checksum

        dev = torch.device(device)
        weights = {
            f"w{i}": torch.zeros(s, dtype=torch.bfloat16, device=dev) for i, s in enumerate(shapes)
        }
        identity = device_identity(dev)
        conn.send("ready")
        rx = None
        while True:
            what, payload = conn.recv()
            if what == "take":
                if rx is None or rx.version != payload.version:
                    rx = BucketReceiver(payload.version, weights, dev, identity)
                conn.send(rx.take(payload))
            elif what == "finish":
                conn.send({"checksum": rx.finish(), "xxh3": weights_checksum(weights)})
            else:
                return
    except BaseException as exc:
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        raise


def _answer(conn):
    got = conn.recv()
    if isinstance(got, dict) and "error" in got:
        raise RuntimeError(f"the receiver process failed: {got['error']}")
    return got


def bench_ipc_handoff(
    device: str = "cpu",
    gib: float = 0.25,
    tensor_mib: int = 64,
    bucket_mib: int = 512,
    repeats: int = 3,
) -> dict:
    """The module's docstring, measured."""
    import torch

    from ..common.cluster.time_sharing import synchronize
    from ..common.wire.ipc_handoff import BucketSender, digest_sums
    from ..common.wire.weights import weights_checksum

    dev = torch.device(device)
    shapes = _shapes(gib, tensor_mib)
    context = mp.get_context("spawn")  # CUDA in both: never fork a process that has it
    here, there = context.Pipe()
    receiver = context.Process(target=_receiver, args=(device, shapes, there))
    receiver.start()
    try:
        g = torch.Generator(device="cpu").manual_seed(0)
        state = {
            f"w{i}": torch.randn(s, generator=g).to(dev, torch.bfloat16)
            for i, s in enumerate(shapes)
        }
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        _answer(here)

        def deliver(message, _bucket):
            here.send(("take", message))
            return _answer(here)

        runs = []
        for version in range(repeats + 1):  # the first maps the handles: not timed
            synchronize(dev)
            t0 = time.perf_counter()
            sender = BucketSender(version, dev, deliver, bucket_mib * 2**20)
            for name, t in state.items():
                sender.add(name, t)
            checksum = sender.finish()
            here.send(("finish", None))
            held = _answer(here)
            seconds = time.perf_counter() - t0
            if sender.error is not None:
                raise RuntimeError(f"the handoff failed: {sender.error}")
            runs.append((seconds, sender, checksum, held))
        synchronize(dev)
        t0 = time.perf_counter()
        digest_sums(list(state.values()))
        digest_s = time.perf_counter() - t0
        xxh3 = weights_checksum(state)
    finally:
        here.send(("stop", None))
        receiver.join(timeout=60)
        if receiver.is_alive():
            receiver.kill()
    seconds, sender, checksum, held = min(runs[1:], key=lambda r: r[0])
    return {
        "device": str(dev),
        "version_gib": round(nbytes / GiB, 3),
        "tensors": len(shapes),
        "bucket_mib": bucket_mib,
        "buckets": sender.buckets,
        "repeats": repeats,
        "seconds": round(seconds, 4),
        "seconds_per_gib": round(seconds / (nbytes / GiB), 4),
        "gib_per_s": round(nbytes / GiB / seconds, 3),
        "host_bytes": sender.host_bytes,
        "host_bytes_per_gib": round(sender.host_bytes / (nbytes / GiB)),
        "checksum_s_per_gib": round(digest_s / (nbytes / GiB), 4),
        "checksums_agree": held["checksum"] == checksum,
        "bytes_agree": held["xxh3"] == xxh3,
    }


def format_ipc_handoff(r: dict) -> str:
    return "\n".join(
        [
            f"a {r['version_gib']:.3f} GiB bfloat16 version ({r['tensors']} tensors) on "
            f"{r['device']}, {r['buckets']} buckets of {r['bucket_mib']} MiB, best of "
            f"{r['repeats']}:",
            f"  {r['seconds']:.3f} s = {r['seconds_per_gib']:.3f} s/GiB ({r['gib_per_s']:.2f} "
            f"GiB/s); the device checksum alone {r['checksum_s_per_gib']:.3f} s/GiB",
            f"  through host memory: {r['host_bytes']} bytes ({r['host_bytes_per_gib']} per "
            "GiB: handles and layouts)",
            f"  the receiver holds the version: checksums {r['checksums_agree']}, bytes "
            f"{r['bytes_agree']}",
        ]
    )
