"""``g2rpo bench handoff CONFIG``: one weight version of the config's full size handed
from a learner process to a rollout-worker process as training hands it over Ray, on
one node, without Ray (the GPU node this is for has none installed):

1. the worker process builds its core (``RolloutWorkerCore``: the pipeline on the
   device) while the learner builds a one-rank learner (``learner_outside_ray``: an
   FSDP2 group of one for a full fine-tune, as in training);
2. the learner gathers the version (``LearnerCore.weights``: bf16 on the host);
3. it puts the version's published form (``common/wire/weights.publishable``: NumPy arrays
   pickled out of band) into one shared-memory file, as ``ray.put`` copies it into the
   node's object store (/dev/shm), and drops its gathered copy;
4. the worker maps that file read-only, unpickles views of it, verifies the checksum
   and loads the version into its transformer on the device
   (``RolloutWorkerCore.load_weights``), then checks what it holds.

Each step's seconds, and each process's host memory (``common/cluster/process_memory``: the
learner's at each step, the worker's peak while it loads, sampled every millisecond by
the learner) beside the version's size: the worker's private growth should stay a small
fraction of it. Ray's own object store is measured on the CPU by ``g2rpo bench
weights-memory``."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import pickle
import tempfile
import time
from pathlib import Path

import numpy as np

from ..common.cluster.process_memory import PeakSampler, read_status
from ..common.config.run import G2RPOConfig

GiB = 2**30
ALIGN = 64  # each buffer starts on a cache line, as in Ray's store


def _gib(status: dict[str, int]) -> dict[str, float]:
    return {k: round(v / GiB, 3) for k, v in status.items() if k != "VmHWM"}


def put_in_file(obj, directory: str) -> tuple[str, list[tuple[int, int]], bytes]:
    """``obj`` pickled with its buffers out of band, the buffers written once into a
    file in ``directory``: (path, [(offset, bytes)], the pickle)."""
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    fd, path = tempfile.mkstemp(prefix="g2rpo-version-", dir=directory)
    spans, offset = [], 0
    with os.fdopen(fd, "wb") as f:
        for b in buffers:
            raw = b.raw()
            offset = -(-offset // ALIGN) * ALIGN
            f.seek(offset)
            f.write(raw)
            spans.append((offset, raw.nbytes))
            offset += raw.nbytes
    return path, spans, payload


def read_from_file(path: str, spans: list[tuple[int, int]], payload: bytes):
    """The object ``put_in_file`` wrote, its arrays read-only views of the mapped file."""
    if not spans:
        return pickle.loads(payload)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    return pickle.loads(payload, buffers=[mapped[o : o + n] for o, n in spans])


def _worker(cfg_data: dict, conn) -> None:
    """The rollout worker's process: build, then load what the learner handed over."""
    try:
        import torch

        from ..common.config.loading import config_from_dict
        from ..common.wire.weights import weights_checksum
        from ..rollout_worker.worker import RolloutWorkerCore

        torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
        cfg = config_from_dict(cfg_data, [])
        t0 = time.perf_counter()
        core = RolloutWorkerCore(cfg, 0)
        conn.send({"build_s": time.perf_counter() - t0, "pid": os.getpid()})
        version, checksum, path, spans, payload = conn.recv()
        gc.collect()
        before = read_status()
        conn.send(before)  # the learner starts sampling this process now
        conn.recv()
        t0 = time.perf_counter()
        loaded = core.load_weights(version, read_from_file(path, spans, payload), checksum)
        load_s = time.perf_counter() - t0
        after = read_status()
        conn.send({"load_s": load_s, "after": after, "loaded_seconds": loaded.seconds})
        conn.recv()
        transformer = core.comps.transformer
        conn.send(
            {
                "holds_the_version": weights_checksum(transformer.state_dict()) == checksum,
                "device": str(next(transformer.parameters()).device),
            }
        )
    except BaseException as exc:
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        raise


def _answer(conn, what: str) -> dict:
    got = conn.recv()
    if isinstance(got, dict) and "error" in got:
        raise RuntimeError(f"the worker process failed {what}: {got['error']}")
    return got


def bench_handoff(cfg: G2RPOConfig, store_dir: str = "/dev/shm") -> dict:
    """The steps of the module's docstring; their seconds and host memory."""
    from ..common.wire.weights import publishable, state_nbytes
    from ..learner.trainer import learner_outside_ray

    context = mp.get_context("spawn")  # CUDA in both: never fork a process that has it
    here, there = context.Pipe()
    worker = context.Process(target=_worker, args=(cfg.model_dump(mode="json"), there))
    worker.start()
    path = None
    try:
        learner_host = {"start": _gib(read_status())}
        t0 = time.perf_counter()
        with learner_outside_ray(cfg) as learner:
            build_s = time.perf_counter() - t0
            learner_host["built"] = _gib(read_status())
            with PeakSampler(["self"]) as gathering:
                t0 = time.perf_counter()
                version, state, checksum = learner.weights()
                gather_s = time.perf_counter() - t0
            learner_host["gathered"] = _gib(read_status())
            nbytes, tensors = state_nbytes(state), len(state)
            t0 = time.perf_counter()
            path, spans, payload = put_in_file(publishable(state), store_dir)
            put_s = time.perf_counter() - t0
            learner_host["put"] = _gib(read_status())
            del state
            gc.collect()
            learner_host["dropped its copy"] = _gib(read_status())
            built = _answer(here, "to build its core")
            here.send((version, checksum, path, spans, payload))
            before = _answer(here, "before loading")
            with PeakSampler([built["pid"]]) as loading:
                here.send("load")
                loaded = _answer(here, "to load the version")
            here.send("check")
            held = _answer(here, "to check its weights")
    finally:
        if path is not None:
            Path(path).unlink(missing_ok=True)
        worker.join(timeout=60)
        if worker.is_alive():
            worker.kill()
    peak = loading.peaks[built["pid"]]
    private = peak["RssAnon"] - before["RssAnon"]
    return {
        "config_device": cfg.model.device,
        "version_gib": round(nbytes / GiB, 3),
        "tensors": tensors,
        "store": store_dir,
        "learner": {
            "build_s": round(build_s, 2),
            "gather_s": round(gather_s, 2),
            "put_s": round(put_s, 2),
            "peak_private_gib_while_gathering": round(gathering.peaks["self"]["RssAnon"] / GiB, 3),
            "host_gib": learner_host,
        },
        "worker": {
            "build_s": round(built["build_s"], 2),
            "load_s": round(loaded["load_s"], 2),
            "host_gib_before_load": _gib(before),
            "peak_host_gib_while_loading": _gib(peak),
            "host_gib_after_load": _gib(loaded["after"]),
            "private_growth_gib": round(private / GiB, 3),
            "private_fraction": round(private / nbytes, 4),
            # the store's pages it reads: shared memory on /dev/shm, file pages on a disk
            "store_pages_mapped_gib": round(
                (peak["RssShmem"] + peak["RssFile"] - before["RssShmem"] - before["RssFile"]) / GiB,
                3,
            ),
            "holds_the_version": held["holds_the_version"],
            "weights_on": held["device"],
        },
    }


def format_handoff(r: dict) -> str:
    w, learner = r["worker"], r["learner"]
    return "\n".join(
        [
            f"a {r['version_gib']:.2f} GiB version ({r['tensors']} tensors) on "
            f"{r['config_device']}, through {r['store']}",
            f"  learner: built {learner['build_s']:.1f} s, gathered {learner['gather_s']:.1f} s, "
            f"put {learner['put_s']:.1f} s; host GiB by step {learner['host_gib']}",
            f"  worker: built {w['build_s']:.1f} s, loaded {w['load_s']:.1f} s onto "
            f"{w['weights_on']} (holds the version: {w['holds_the_version']}); private "
            f"growth {w['private_growth_gib']:.3f} GiB = {w['private_fraction']:.1%} of the "
            f"version, the store's pages mapped {w['store_pages_mapped_gib']:.3f} GiB",
        ]
    )
