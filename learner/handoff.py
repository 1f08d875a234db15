"""A learner rank's side of the colocated handoff (``common/wire/ipc_handoff.py``): the
version gathered tensor by tensor on this rank's device and packed into the bucket its
rollout worker maps. In an FSDP group every rank gathers every tensor (``full_tensor``
is a collective) and each hands its own worker the whole version: every worker needs
all of it. A rank with no worker to hand to (another device, a restarted worker) still
gathers, so the group's collectives stay in step."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch

from ..common.wire.ipc_handoff import BUCKET_BYTES, BucketMessage, BucketSender, HandoffResult
from .checkpoints import gathered_tensors


def rollout_tensors(core) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight the rollout workers load (a full fine-tune's: the transformer's state
    dict), whole, on this rank's device, in ``model.rollout_weights_dtype``, one at a
    time (``gathered_tensors``: each rank casts its shard, then the group gathers it)."""
    dtype = getattr(torch, core.cfg.model.rollout_weights_dtype)
    return gathered_tensors(core.transformer, dtype)


def hand_over(
    core,
    deliver: Callable[[BucketMessage, torch.Tensor], object] | None,
    finish: Callable[[str], object] | None,
    bucket_bytes: int = BUCKET_BYTES,
    in_process: bool = False,
) -> tuple[HandoffResult, BaseException | None]:
    """Gather the core's current version and hand it, bucket by bucket, to ``deliver``
    (the message and the bucket; it returns once the worker copied the bucket out);
    then ``finish(checksum)`` returns the worker's answer. ``deliver`` None: gather
    only. The moments go to the host first where ``train.offload.learner`` sends them
    (the gather needs only the weights): the device then holds the weights, one bucket
    and the worker's transformer. ``in_process``: the worker is in this process and
    takes each bucket itself, no handle made (``g2rpo doctor``).
    (result, the error that stopped the handoff or None)."""
    t0 = time.perf_counter()
    core.offload(("optimizer",))
    core.resident(("weights",))
    device = core.turn.device
    sender = BucketSender(core.version, device, deliver, bucket_bytes, not in_process)
    with torch.no_grad():
        for name, tensor in rollout_tensors(core):
            sender.add(name, tensor)
            del tensor
    checksum = sender.finish()
    loaded, error = None, sender.error
    if deliver is not None and error is None and finish is not None:
        try:
            loaded = finish(checksum)
        except Exception as exc:
            error = exc
    result = HandoffResult(
        version=core.version,
        checksum=checksum,
        nbytes=sender.nbytes,
        seconds=time.perf_counter() - t0,
        buckets=sender.buckets,
        host_bytes=sender.host_bytes,
        loaded=loaded,
    )
    return result, error
