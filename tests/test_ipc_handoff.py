"""The colocated handoff's protocol (common/wire/ipc_handoff.py) between two real Ray actor
processes on the CPU: the sender's buckets are shared-memory tensors reduced by torch's
own reductions, rebuilt in the receiver's process, copied into its weights, then freed.
What crosses Ray is counted two ways: the pickled messages, and Ray's object store's own
counter of bytes created, with a put of the same version beside it to show the counter
counts. All of it fails on 3bb9114, which had no such module (the version went learner ->
host -> object store -> worker)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import ray
import torch
from g2rpo.common.wire.ipc_handoff import (
    BucketReceiver,
    BucketSender,
    digest_hex,
    digest_sums,
    tensor_digest,
)
from g2rpo.common.wire.weights import WeightMismatch, publishable, weights_checksum
from ray import cloudpickle

# the actors below travel to Ray's worker processes by value: this file is no module there
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def store_bytes_created() -> int:
    """Bytes ever created in the object stores of the local Ray (Ray's own counter)."""
    from ray._private.internal_api import node_stats

    return sum(
        node_stats(
            n["NodeManagerAddress"], n["NodeManagerPort"], include_memory_info=False
        ).store_stats.cumulative_created_bytes
        for n in ray.nodes()
        if n["Alive"]
    )


def a_version(tensors: int, elements: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """bfloat16 weights and one odd-sized int8 buffer (a byte count no 16-bit word splits)."""
    g = torch.Generator().manual_seed(seed)
    state = {f"blocks.{i}.weight": torch.randn(elements, generator=g) for i in range(tensors)}
    state = {k: v.to(torch.bfloat16) for k, v in state.items()}
    state["index"] = torch.randint(-100, 100, (7,), generator=g, dtype=torch.int8)
    return state


@ray.remote(num_cpus=1)
class Receiver:
    """A rollout worker's side: zeros of the version's shapes, filled only by the handoff."""

    def __init__(self, shapes: dict) -> None:
        self.weights = {k: torch.zeros(shape, dtype=dtype) for k, (shape, dtype) in shapes.items()}
        self.rx = None

    def take(self, message) -> int:
        if self.rx is None:
            self.rx = BucketReceiver(message.version, self.weights, torch.device("cpu"))
        return self.rx.take(message)

    def finish(self) -> tuple[str, str]:
        """(the device checksum of what it holds, XXH3 of its bytes)."""
        return self.rx.finish(), weights_checksum(self.weights)


@ray.remote(num_cpus=1)
class Sender:
    """A learner rank's side: its version, handed to ``receiver`` bucket by bucket."""

    def __init__(self, tensors: int, elements: int) -> None:
        self.state = a_version(tensors, elements)

    def shapes(self) -> dict:
        return {k: (tuple(v.shape), v.dtype) for k, v in self.state.items()}

    def put(self) -> list:
        return [ray.put(publishable(self.state))]  # the object-store path, for comparison

    def hand_over(self, receiver, bucket_bytes: int) -> dict:
        def deliver(message, _bucket):
            return ray.get(receiver.take.remote(message))

        sender = BucketSender(1, torch.device("cpu"), deliver, bucket_bytes)
        for name, tensor in self.state.items():
            sender.add(name, tensor)
        return {
            "checksum": sender.finish(),
            "xxh3": weights_checksum(self.state),
            "buckets": sender.buckets,
            "host_bytes": sender.host_bytes,
            "nbytes": sender.nbytes,
            "error": repr(sender.error) if sender.error else None,
        }


def _handoff(tensors: int, elements: int, bucket_bytes: int) -> dict:
    sender = Sender.remote(tensors, elements)
    receiver = Receiver.remote(ray.get(sender.shapes.remote()))
    ray.get(receiver.__ray_ready__.remote())
    before = store_bytes_created()
    sent = ray.get(sender.hand_over.remote(receiver, bucket_bytes))
    held, held_xxh3 = ray.get(receiver.finish.remote())
    sent["store_bytes"] = store_bytes_created() - before
    before = store_bytes_created()
    ray.get(sender.put.remote())
    sent["store_bytes_of_a_put"] = store_bytes_created() - before
    for actor in (sender, receiver):
        ray.kill(actor)
    sent.update(held=held, held_xxh3=held_xxh3)
    return sent


def test_a_version_crosses_two_ray_actors_and_none_of_its_bytes_cross_ray(ray_local):
    """Catches: a handoff whose receiver does not end up with the sender's bytes (it
    starts from zeros), one that copies the version through Ray (the store's counter or
    the pickled messages would grow with it), and a bucket reused before the receiver's
    ack (the bytes would differ)."""
    small = _handoff(tensors=8, elements=32 << 10, bucket_bytes=4 * 64 << 10)  # 64 KiB each
    large = _handoff(tensors=8, elements=512 << 10, bucket_bytes=4 * 1 << 20)  # 1 MiB each
    for run in (small, large):
        assert run["error"] is None
        assert run["held_xxh3"] == run["xxh3"]  # every byte arrived
        assert run["held"] == run["checksum"]  # and the device checksums agree
        assert run["buckets"] == 3  # 4 tensors a bucket, then the last ones
        assert run["store_bytes"] == 0  # nothing went into Ray's object store
        assert run["store_bytes_of_a_put"] >= run["nbytes"]  # (which counts a put)
    assert large["nbytes"] == 16 * small["nbytes"] - 15 * 7  # (the int8 buffer)
    # what crossed Ray: handles and layouts, the same whatever the version's size
    assert large["host_bytes"] < 1.02 * small["host_bytes"]
    assert large["host_bytes"] < large["nbytes"] / 1000


def test_a_receiver_that_refuses_a_tensor_stops_the_handoff_and_the_checksum_stays():
    """In one process (a bucket rebuilt from its shared-memory handle): a receiver whose
    weight has another shape refuses, naming it; the sender packs the rest anyway (a
    learner group's gathers must all run) and its checksum is still the version's."""
    state = a_version(6, 1000)
    taken = []

    def clean(message, _bucket):
        taken.append(message.index)

    reference = BucketSender(4, torch.device("cpu"), clean, bucket_bytes=4096)
    for name, t in state.items():
        reference.add(name, t)
    checksum = reference.finish()
    assert taken == [0, 1, 2, 3]  # 2000 bytes a tensor: 2 per 4 KiB bucket, the buffer last

    targets = {k: torch.zeros_like(v) for k, v in state.items()}
    targets["blocks.3.weight"] = torch.zeros(999, dtype=torch.bfloat16)
    receiver = BucketReceiver(4, targets, torch.device("cpu"))
    sender = BucketSender(4, torch.device("cpu"), lambda m, _b: receiver.take(m), 4096)
    for name, t in state.items():
        sender.add(name, t)
    assert sender.finish() == checksum
    assert isinstance(sender.error, WeightMismatch) and "blocks.3.weight" in str(sender.error)
    assert sender.buckets == 4 and sender.nbytes == reference.nbytes
    assert torch.equal(targets["blocks.0.weight"], state["blocks.0.weight"])  # before it
    assert not targets["blocks.5.weight"].any()  # after it: never handed over
    with pytest.raises(WeightMismatch, match="not handed over"):
        receiver.finish()


def test_a_tensor_larger_than_a_bucket_gets_one_of_its_own():
    state = {"small": torch.ones(10), "huge": torch.arange(5000, dtype=torch.float32)}
    targets = {k: torch.zeros_like(v) for k, v in state.items()}
    receiver = BucketReceiver(0, targets, torch.device("cpu"))
    sender = BucketSender(0, torch.device("cpu"), lambda m, _b: receiver.take(m), 1024)
    for name, t in state.items():
        sender.add(name, t)
    assert sender.finish() == receiver.finish()
    assert sender.buckets == 2 and torch.equal(targets["huge"], state["huge"])


def test_the_device_checksum_is_two_exact_sums_and_sees_a_moved_word():
    """Known answer: the sums of the tensor's 16-bit words read as unsigned, plain and
    weighted by position mod 255 plus one (what a GPU computes; the CPU hashes the bytes
    with XXH3 instead); two words swapped keep the plain sum and change the weighted
    one; the version's checksum differs by either, and by the tensor's name."""
    t = torch.tensor([1.0, -2.0, 3.5, 0.0, 65504.0] * 60, dtype=torch.float16)
    words = t.view(torch.int16).numpy().astype(np.int64) & 0xFFFF
    positions = np.arange(len(words)) % 255 + 1
    assert tensor_digest(t).tolist() == [int(words.sum()), int((words * positions).sum())]
    swapped = t[[1, 0, *range(2, len(t))]]
    assert tensor_digest(swapped)[0] == tensor_digest(t)[0]
    assert tensor_digest(swapped)[1] != tensor_digest(t)[1]
    one = digest_hex([("w", t)], digest_sums([t]))
    assert one != digest_hex([("w", swapped)], digest_sums([swapped]))
    assert one != digest_hex([("v", t)], digest_sums([t]))  # the name counts too
