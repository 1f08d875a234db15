"""The doctor's colocated phases (``train.placement: colocated``), after its one update:
the turns a learner rank and its rollout worker take on one GPU, each checked on the
device, which no CPU run can do (``DeviceTurn`` moves nothing on the CPU).

- ``offload worker``: the worker's transformer to the host, as after its rollout (its
  text encoders and VAE stay);
- ``handoff``: as a colocated rank publishes (``learner/handoff.py``): the moments to the
  host where ``train.offload.learner`` sends them, the new version gathered on the device
  bucket by bucket and copied into the worker's transformer, which comes back onto the
  device for it, checked by its device checksum (``common/wire/ipc_handoff.py``); then the rank
  steps aside: what ``train.offload.learner`` sends to the host (all: fp32 shards,
  gradients, AdamW moments, fused on CUDA, any KL reference), nothing of it left on the
  device. One process here, so each bucket is handed over as itself, not through a CUDA
  IPC handle (``g2rpo bench ipc-handoff`` runs the two processes);
- ``rollout again``: the worker, on the device, samples on that version;
- ``onload, learn``: the worker steps aside, the next update brings the learner's
  state back (``resident``) and steps AdamW on moments that moved; every tensor of the
  learner is on the device after.

Each phase reports its seconds, the device's peak (the doctor's), what the moved side
left on the device, and this process's host memory (the offloaded state lands there)."""

from __future__ import annotations

import time

import numpy as np
import torch

from ..common.cluster.process_memory import read_status
from ..common.cluster.time_sharing import device_bytes

GiB = 2**30


def host_memory_gib() -> dict[str, float]:
    """This process's resident memory, GiB: private (RssAnon), shared (RssShmem: object
    store pages it maps) and their sum with file pages (VmRSS)."""
    status = read_status()
    return {k: round(status[k] / GiB, 3) for k in ("VmRSS", "RssAnon", "RssShmem")}


def learner_tensors(learner, parts=("optimizer", "weights")) -> list[torch.Tensor]:
    """Every tensor a learner core keeps (of ``parts``, as ``train.offload.learner``
    names them): the held modules' parameters, gradients and buffers (``weights``), and
    its optimizer's per-parameter state (``optimizer``; AdamW's ``step`` counters aside:
    they stay where the optimizer keeps them)."""
    out: list[torch.Tensor] = []
    for module in learner._held_modules() if "weights" in parts else ():
        for p in module.parameters():
            out.append(p)
            if p.grad is not None:
                out.append(p.grad)
        out.extend(module.buffers())
    for state in learner.optimizer.state.values() if "optimizer" in parts else ():
        out.extend(v for k, v in state.items() if torch.is_tensor(v) and k != "step")
    return [t.to_local() if hasattr(t, "to_local") else t for t in out]


def worker_tensors(worker) -> list[torch.Tensor]:
    transformer = worker.comps.transformer
    return [*transformer.parameters(), *transformer.buffers()]


def _left_on_device(tensors, device: torch.device, who: str) -> float:
    left = device_bytes(tensors, device.type)
    if left:
        raise RuntimeError(
            f"{who} left {left / GiB:.3f} GiB on {device} after offloading: the colocated "
            "pair's other side would not get it (train.placement)"
        )
    return 0.0


def colocated_phases(doctor) -> None:
    """The phases above, on the doctor's cores (after its ``learn`` phase made v1)."""
    device = doctor.memory.device
    with doctor.phase("offload worker", "rollout worker", needs=("learn",)) as r:
        if r is not None:  # as after its rollout: the update has the GPU
            seconds = doctor.worker.offload()
            _left_on_device(worker_tensors(doctor.worker), device, "the rollout worker")
            r.details = {"offload_s": round(seconds, 3), "host_gib": host_memory_gib()}
    with doctor.phase("handoff", "learner rank", needs=("offload worker",)) as r:
        if r is not None:
            _handoff(doctor, r, device)
    with doctor.phase("rollout again", "rollout worker", needs=("handoff",)) as r:
        if r is not None:  # on the version handed over, the learner's state on the host
            # (the transformer came back onto the device to take the version)
            onload_s = doctor.worker.resident() + doctor.worker.onload_at_handoff_s
            doctor.worker.onload_at_handoff_s = 0.0
            t0 = time.perf_counter()
            doctor.resampled = doctor.worker.sample(1, doctor.prompts)
            r.details = {
                "worker_onload_s": round(onload_s, 3),
                "sample_s": round(time.perf_counter() - t0, 3),
            }
    with doctor.phase("onload, learn", "learner rank", needs=("rollout again",)) as r:
        if r is not None:
            doctor.worker.offload()
            _learn_after_onload(doctor, r, device)


def _learn_after_onload(doctor, r, device: torch.device) -> None:
    plan, cond, result, images = doctor.resampled
    leaf_prompts = [doctor.prompts[leaf.prompt] for leaf in plan.leaves]
    scores = {
        name: np.asarray(s.score(images.numpy(), leaf_prompts), dtype=np.float64)
        for name, s in doctor.scorers.items()
    }
    batch = doctor.worker.trajectories(1, doctor.prompts, plan, cond, result, scores)
    stats = doctor.learner.update([batch])
    if not np.isfinite(stats["loss"]) or not np.isfinite(stats["grad_norm"]):
        raise ValueError(f"non-finite update: loss {stats['loss']}, grad {stats['grad_norm']}")
    elsewhere = [t for t in learner_tensors(doctor.learner) if t.device.type != device.type]
    if elsewhere:
        raise RuntimeError(
            f"{len(elsewhere)} of the learner's tensors stayed off {device} after the update"
        )
    kernels = {bool(g.get("fused")) for g in doctor.learner.optimizer.param_groups}
    r.details = {
        "onload_s": round(stats.get("time/learner_onload_s", 0.0), 3),
        "optimizer": "fused AdamW" if kernels == {True} else "AdamW",
        "loss": stats["loss"],
        "grad_norm": stats["grad_norm"],
    }


def _handoff(doctor, r, device: torch.device) -> None:
    """Publish as a colocated rank does (the module's docstring): the version handed
    into the worker's transformer on the device, then the rank steps aside."""
    from ..learner.handoff import hand_over

    learner, worker = doctor.learner, doctor.worker
    result, error = hand_over(
        learner,
        lambda message, bucket: worker.take_bucket(message, bucket),
        lambda checksum: worker.finish_handoff(learner.version, checksum),
        in_process=True,
    )
    if error is not None:
        raise error
    learner.offload()
    parts = learner.turn.offloaded
    _left_on_device(learner_tensors(learner, parts), device, "the learner rank")
    r.details = {
        "published_gib": round(result.nbytes / GiB, 3),
        "handoff_s": round(result.seconds, 3),
        "gib_per_s": round(result.nbytes / GiB / max(result.seconds, 1e-9), 3),
        "buckets": result.buckets,
        "offload": {
            "learner": ",".join(parts) or "none",
            "worker": ",".join(worker.turn.offloaded) or "none",
        },
        "learner_offload_s": round(learner.turn.offload_s, 3),
        "worker_onload_s": round(worker.onload_at_handoff_s, 3),
        "load_s": round(result.loaded.seconds, 3),
        "host_gib_while_loading": host_memory_gib(),
    }
