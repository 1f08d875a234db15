"""A weight version handed from one process to another inside one device
(``train.placement: colocated``): learner rank i and rollout worker i share GPU i as two
processes, and the version never leaves it.

The sender packs the version's tensors, gathered one at a time on its device, into one
flat bucket there; it hands the receiver a handle to the bucket — torch's own reduction of
the tensor (``torch.multiprocessing.reductions.reduce_tensor``): a CUDA IPC memory handle
for a CUDA tensor, a shared-memory file's name for a CPU one — and waits. The receiver
rebuilds the bucket from the handle (a view of the sender's memory, no copy), copies each
tensor into its own weights on the same device, waits for those copies, drops the view
and acknowledges; only then does the sender refill the bucket with the next tensors. So
the device holds one bucket beyond both sides' weights, and what crosses between the
processes (through Ray: a task's pickled arguments) is the handles and the tensors'
names, shapes and offsets: a few hundred bytes per bucket, none of the version's bytes
(``BucketSender.host_bytes`` counts them; tests/test_ipc_handoff.py also reads Ray's
object store). On the CPU the same protocol runs over shared memory, which is how the
CPU tests run it.

What was handed over is verified cheaply where it lies (``digest_sums``): each side
reduces each tensor's bytes to two integers on the device (``tensor_digest``: plain and
position-weighted sums of its 16-bit words, exact on any device; on the CPU, XXH3 of the
bytes, which is faster there), the sender over the bucket it filled, the receiver over
its own weights after the copies; the per-tensor integers, names, dtypes and shapes are
hashed on the host (XXH3-128) into the version's checksum. It catches a handle mapped to the wrong
memory, a bucket overwritten before the receiver's copy finished and a tensor copied into
the wrong weight; it is not a cryptographic hash, nor the object store's XXH3 of the
bytes (``common/wire/weights.py``), which a version loaded from the store carries instead.

The object store stays the path for what this cannot reach: another device, a worker
restarted without its pipeline, the evaluator, LoRA adapters (``orchestration/
publishing.py``)."""

from __future__ import annotations

import inspect
import math
import pickle
import socket
import struct
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash

from ..cluster.time_sharing import synchronize
from .messages import WeightsLoaded
from .weights import WeightMismatch, tensor_bytes, tensor_header

BUCKET_BYTES = 512 * 2**20  # one bucket on the device at a time; ~48 handoffs of a FLUX version
ALIGN = 256  # each tensor starts on this boundary: a view of any dtype is aligned
DIGEST_MODULUS = 255  # positions weigh 1..255: a word moved changes the weighted sum
DIGEST_CHUNK = 1 << 24  # words reduced at a time (int32 temporaries of 64 MiB)


@dataclass(frozen=True)
class Entry:
    """One tensor in a bucket: its bytes at ``offset``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * getattr(torch, self.dtype).itemsize


@dataclass(frozen=True)
class BucketMessage:
    """What crosses between the processes for one bucket: the handle and the layout."""

    version: int
    index: int
    entries: tuple[Entry, ...]
    handle: bytes  # the bucket's reduction (``share``), pickled


@dataclass(frozen=True)
class HandoffResult:
    """A learner rank's handoff of a version to its worker: the version, its device
    checksum, its bytes, the rank's seconds (gather, pack, hand over, wait), the buckets
    and the bytes that crossed between the processes; the worker's answer (None when the
    rank did not hand over, ``reason`` saying why: the driver then loads that worker from
    the object store)."""

    version: int
    checksum: str
    nbytes: int
    seconds: float
    buckets: int
    host_bytes: int
    loaded: WeightsLoaded | None = None
    reason: str | None = None


def device_identity(device: str | torch.device) -> str | None:
    """What two processes compare to know they share ``device``: a CUDA GPU's UUID (each
    process may number its visible GPUs differently); for the CPU the host (its name and
    boot id: shared memory spans one kernel); None for any other device, which this
    handoff does not serve."""
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return None
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{torch.cuda.get_device_properties(index).uuid}"
    if device.type == "cpu":
        boot = Path("/proc/sys/kernel/random/boot_id")
        return f"host:{socket.gethostname()}:{boot.read_text().strip() if boot.exists() else ''}"
    return None


def _local_cuda_index(identity: str) -> int:
    for i in range(torch.cuda.device_count()):
        if f"cuda:{torch.cuda.get_device_properties(i).uuid}" == identity:
            return i
    raise RuntimeError(f"this process sees no GPU {identity}")


@contextmanager
def _shared_by_name():
    """CPU storages reduced by name (torch's file_system strategy): the receiver maps the
    shared-memory file by its name; a file descriptor would only reach a child process."""
    import torch.multiprocessing as tmp

    before = tmp.get_sharing_strategy()
    tmp.set_sharing_strategy("file_system")
    try:
        yield
    finally:
        tmp.set_sharing_strategy(before)


def shareable_bucket(nbytes: int, device: torch.device) -> torch.Tensor:
    """An empty bucket the receiver can map: device memory on CUDA (any allocation is),
    a shared-memory file on the CPU (made shared before it is filled: no copy later)."""
    bucket = torch.empty(nbytes, dtype=torch.uint8, device=device)
    if device.type == "cpu":
        with _shared_by_name():
            bucket.share_memory_()
    return bucket


def share(bucket: torch.Tensor) -> bytes:
    """``bucket``'s handle: ``reduce_tensor``'s (rebuild function, arguments), pickled with
    multiprocessing's pickler, through which a CPU storage reduces to its file's name."""
    from multiprocessing.reduction import ForkingPickler

    from torch.multiprocessing.reductions import reduce_tensor

    with _shared_by_name():
        return bytes(ForkingPickler.dumps(reduce_tensor(bucket)))


def rebuild(handle: bytes, identity: str | None = None) -> torch.Tensor:
    """The bucket ``share`` reduced, as a tensor viewing the sender's memory. A CUDA
    handle names the sender's device index; ``identity`` (``device_identity``) finds the
    same GPU among this process's."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    rebuild_fn, args = pickle.loads(handle)
    if rebuild_fn is rebuild_cuda_tensor and identity is not None:
        names = list(inspect.signature(rebuild_cuda_tensor).parameters)
        args = list(args)
        args[names.index("storage_device")] = _local_cuda_index(identity)
    return rebuild_fn(*args)


def tensor_digest(t: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Two int64 sums of ``t``'s bytes on its device: of its 16-bit words (bytes when
    odd in number) read as unsigned, and of each word times its position in its chunk of
    2^24 words mod 255, plus one (``weights``: those factors, int32, when the caller made
    them already). Exact on any device: a product stays under 2^24 in int32, a chunk's
    sum under 2^48 in int64."""
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
    words = flat.view(torch.int16) if flat.numel() % 2 == 0 else flat
    if weights is None:
        weights = _position_weights(min(words.numel(), DIGEST_CHUNK), t.device)
    total = torch.zeros(2, dtype=torch.int64, device=t.device)
    for start in range(0, words.numel(), DIGEST_CHUNK):
        w = words[start : start + DIGEST_CHUNK].to(torch.int32)
        if words.dtype == torch.int16:
            w &= 0xFFFF
        plain = w.sum(dtype=torch.int64)
        w *= weights[: w.numel()]
        total += torch.stack([plain, w.sum(dtype=torch.int64)])
    return total


def _position_weights(n: int, device: torch.device) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int32, device=device) % DIGEST_MODULUS + 1


def digest_sums(tensors: list[torch.Tensor]) -> list[tuple[int, int]]:
    """Each tensor's pair of sums, read back in one transfer: ``tensor_digest`` on a
    device; on the CPU, where the bytes are host memory already, their XXH3-64 (and 0),
    which is exact and runs at memory speed there."""
    if not tensors:
        return []
    if tensors[0].device.type == "cpu":
        return [(xxhash.xxh3_64_intdigest(tensor_bytes(t)), 0) for t in tensors]
    longest = max(t.numel() * t.element_size() for t in tensors) // 2 + 1
    weights = _position_weights(min(longest, DIGEST_CHUNK), tensors[0].device)
    sums = torch.stack([tensor_digest(t, weights) for t in tensors]).cpu().tolist()
    return [(int(a), int(b)) for a, b in sums]


def digest_hex(entries: list[tuple[str, torch.Tensor]], sums: list[tuple[int, int]]) -> str:
    """The version's device checksum: each tensor's header (name, dtype, shape) and sums,
    in the order handed over, hashed on the host."""
    h = xxhash.xxh3_128()
    for (name, t), (a, b) in zip(entries, sums, strict=True):
        h.update(tensor_header(name, t))
        h.update(struct.pack("<QQ", a, b))
    return "device:" + h.hexdigest()


class _Meta:
    """A tensor's header without its bytes (what ``tensor_header`` reads)."""

    def __init__(self, dtype: str, shape: tuple[int, ...]) -> None:
        self.dtype, self.shape = getattr(torch, dtype), torch.Size(shape)


class BucketSender:
    """The sender's side: ``add`` each (name, tensor on ``device``) in order, then
    ``finish``. A full bucket is handed to ``deliver`` (it returns once the receiver has
    copied it out) and only then refilled; it is given the message and the bucket itself
    (which only a receiver in this same process may use). ``deliver`` None, or once it
    raised (the error is kept in ``error``): the buckets are still packed and checksummed
    but not handed over (a learner group's gathers must all run, and the checksum is the
    version's)."""

    def __init__(
        self,
        version: int,
        device: torch.device,
        deliver: Callable[[BucketMessage, torch.Tensor], object] | None,
        bucket_bytes: int = BUCKET_BYTES,
        handles: bool = True,
    ) -> None:
        """``handles`` False: the receiver is this process and takes the bucket itself
        (no handle is made: a process cannot open its own CUDA IPC handle)."""
        self.version, self.device, self.deliver = version, torch.device(device), deliver
        self.handles = handles
        self.capacity = bucket_bytes
        self.bucket: torch.Tensor | None = None
        self.entries: list[Entry] = []
        self.fill = 0
        self.headers: list[tuple[str, _Meta]] = []
        self.sums: list[tuple[int, int]] = []
        self.buckets = self.host_bytes = self.nbytes = 0
        self.error: BaseException | None = None

    def add(self, name: str, tensor: torch.Tensor) -> None:
        t = tensor.detach()
        n = t.numel() * t.element_size()
        start = -(-self.fill // ALIGN) * ALIGN
        if self.entries and start + n > self.capacity:
            self._flush()
            start = 0
        if self.bucket is None or n > self.bucket.numel():
            self.bucket = None  # (empty: the last one was handed over and acknowledged)
            self.bucket = shareable_bucket(max(self.capacity, n), self.device)
        self.bucket[start : start + n].copy_(t.contiguous().reshape(-1).view(torch.uint8))
        dtype = str(t.dtype).removeprefix("torch.")
        self.entries.append(Entry(name, dtype, tuple(t.shape), start))
        self.fill = start + n
        self.nbytes += n

    def _views(self) -> list[torch.Tensor]:
        return [
            self.bucket[e.offset : e.offset + e.nbytes].view(getattr(torch, e.dtype))
            for e in self.entries
        ]

    def _flush(self) -> None:
        if not self.entries:
            return
        sums = digest_sums(self._views())  # (its read-back waits for the bucket's copies)
        synchronize(self.device)
        if self.deliver is not None:
            handle = share(self.bucket) if self.handles else b""
            message = BucketMessage(self.version, self.buckets, tuple(self.entries), handle)
            self.host_bytes += len(pickle.dumps(message))
            try:
                self.deliver(message, self.bucket)
            except Exception as exc:  # the receiver is gone or refused: the rest stays
                self.error, self.deliver = exc, None
                self.bucket = None  # (the receiver may still map it: a fresh one from here)
        self.headers += [(e.name, _Meta(e.dtype, e.shape)) for e in self.entries]
        self.sums += sums
        self.buckets += 1
        self.entries, self.fill = [], 0

    def finish(self) -> str:
        """Hand over the last bucket, free the bucket; the version's device checksum."""
        self._flush()
        self.bucket = None
        if self.device.type == "cuda":
            torch.cuda.ipc_collect()  # blocks the receiver held are freed once it let go
        return digest_hex(self.headers, self.sums)


class BucketReceiver:
    """The receiver's side for one version: ``take`` each bucket into ``targets`` (name ->
    this process's tensor on ``device``: its weights), then ``finish``."""

    def __init__(
        self,
        version: int,
        targets: dict[str, torch.Tensor],
        device: torch.device,
        identity: str | None = None,
    ) -> None:
        self.version, self.targets, self.device = version, targets, torch.device(device)
        self.identity = identity
        self.order: list[str] = []

    def take(self, message: BucketMessage, bucket: torch.Tensor | None = None) -> int:
        """Copy the bucket's tensors into their targets and wait for the copies (the
        sender refills the bucket once this returns); the tensors taken. ``bucket``: the
        sender's bucket itself, when both sides are one process (``g2rpo doctor``: a
        process cannot open its own CUDA IPC handle); else rebuilt from the handle."""
        if message.version != self.version:
            raise WeightMismatch(f"bucket of v{message.version} in a handoff of v{self.version}")
        if bucket is None:
            bucket = rebuild(message.handle, self.identity)
        with torch.no_grad():
            for e in message.entries:
                target = self.targets.get(e.name)
                if target is None:
                    raise WeightMismatch(f"weights v{self.version}: unexpected tensor {e.name}")
                if str(target.dtype).removeprefix("torch.") != e.dtype or tuple(
                    target.shape
                ) != tuple(e.shape):
                    raise WeightMismatch(
                        f"weights v{self.version}: {e.name} is {e.dtype} {list(e.shape)}, "
                        f"held as {target.dtype} {list(target.shape)}"
                    )
                view = bucket[e.offset : e.offset + e.nbytes].view(getattr(torch, e.dtype))
                target.copy_(view.view(target.shape))
                self.order.append(e.name)
        synchronize(self.device)
        del bucket
        return len(message.entries)

    def finish(self) -> str:
        """Every target written once: the device checksum of what this side now holds."""
        missing = sorted(set(self.targets) - set(self.order))
        if missing or len(self.order) != len(set(self.order)):
            raise WeightMismatch(f"weights v{self.version}: not handed over: {missing[:5]}")
        entries = [(name, self.targets[name]) for name in self.order]
        return digest_hex(entries, digest_sums([t for _, t in entries]))
