"""Weight broadcast over a process group of its own (``train.weights.transport:
collective``), without Ray: learner rank 0 is rank 0 here, the rollout workers
ranks 1..W. The weights travel as a few flat buckets per dtype (one broadcast
each) described by a ``Layout`` that the driver hands every worker beside the
version and checksum; a worker unpacks views of the buckets, verifies the
checksum and loads them strictly, exactly as from the object store.

The group is built from a TCPStore and a gloo (CPU) or NCCL (GPU) backend
directly, not as torch.distributed's default group: learner rank 0 already
belongs to the learner group, and a process has only one default group (Ray's
``ray.util.collective`` gloo groups use it too, so they cannot serve here). A
member that died leaves the group broken; the driver forms a new one, named
afresh, with the restarted actor."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ..cluster.net import pin_to_ray_node
from ..config.run import G2RPOConfig

BUCKET_BYTES = 256 * 2**20


def backend_for(device: str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def use_device(device: str) -> None:
    """Make ``device`` this process's current CUDA device (``cuda`` means the first
    one it sees: Ray gives each GPU actor its own)."""
    d = torch.device(device)
    if d.type == "cuda":
        torch.cuda.set_device(d.index or 0)


@dataclass(frozen=True)
class Slot:
    name: str
    shape: tuple[int, ...]
    bucket: int
    offset: int


@dataclass(frozen=True)
class Layout:
    """Where each tensor lies in the flat buckets: (dtype name, elements) per bucket."""

    slots: tuple[Slot, ...]
    buckets: tuple[tuple[str, int], ...]

    @property
    def nbytes(self) -> int:
        return sum(n * getattr(torch, d).itemsize for d, n in self.buckets)


def layout_of(state: dict[str, torch.Tensor], bucket_bytes: int = BUCKET_BYTES) -> Layout:
    """Tensors grouped by dtype, in name order, into buckets of at most
    ``bucket_bytes`` (a larger tensor gets a bucket of its own)."""
    slots, buckets = [], []
    open_bucket: dict[torch.dtype, int] = {}
    for name in sorted(state):
        t = state[name]
        dtype, n = t.dtype, t.numel()
        b = open_bucket.get(dtype)
        if b is None or (buckets[b][1] + n) * t.element_size() > bucket_bytes:
            b = len(buckets)
            buckets.append([str(dtype).removeprefix("torch."), 0])
            open_bucket[dtype] = b
        slots.append(Slot(name, tuple(t.shape), b, buckets[b][1]))
        buckets[b][1] += n
    return Layout(tuple(slots), tuple((d, n) for d, n in buckets))


def pack_bucket(state: dict[str, torch.Tensor], layout: Layout, bucket: int, device):
    """One flat bucket of ``layout``, filled from ``state``."""
    dtype, n = layout.buckets[bucket]
    buf = torch.empty(n, dtype=getattr(torch, dtype), device=device)
    for s in layout.slots:
        if s.bucket == bucket:
            flat = state[s.name].detach().reshape(-1)
            buf[s.offset : s.offset + flat.numel()].copy_(flat)
    return buf


def pack(state: dict[str, torch.Tensor], layout: Layout, device) -> list[torch.Tensor]:
    return [pack_bucket(state, layout, b, device) for b in range(len(layout.buckets))]


def unpack(buffers: list[torch.Tensor], layout: Layout) -> dict[str, torch.Tensor]:
    """Views of the buckets, one per tensor (no copy)."""
    return {
        s.name: buffers[s.bucket][s.offset : s.offset + math.prod(s.shape)].view(s.shape)
        for s in layout.slots
    }


class WeightGroup:
    """One member of a weight-broadcast group. Rank 0 hosts the rendezvous store
    at ``address`` (host:port); every member's constructor blocks until all
    ``world`` members joined."""

    def __init__(
        self, name: str, address: str, rank: int, world: int, device: str, timeout_s: float
    ) -> None:
        pin_to_ray_node()  # gloo and NCCL on the interface other nodes reach (net.py)
        host, port = address.rsplit(":", 1)
        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore(
            host, int(port), world, is_master=rank == 0, timeout=timeout, wait_for_workers=False
        )
        self._store = store  # the master's socket must outlive the group's setup
        prefixed = dist.PrefixStore(f"g2rpo-weights/{name}", store)
        self.name, self.rank, self.world = name, rank, world
        self.device = torch.device(device)
        if backend_for(device) == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            use_device(device)
            self.pg = dist.ProcessGroupNCCL(prefixed, rank, world, options)
        else:
            self.pg = dist.ProcessGroupGloo(prefixed, rank, world, timeout)

    def send(self, state: dict[str, torch.Tensor], layout: Layout) -> None:
        """Rank 0: broadcast ``state`` one bucket at a time (one bucket on the device
        at a time, so a large model never needs a second copy there)."""
        for b in range(len(layout.buckets)):
            buf = pack_bucket(state, layout, b, self.device)
            self.pg.broadcast(buf, 0).wait()
            if buf.is_cuda:
                torch.cuda.current_stream().synchronize()  # NCCL's wait only orders streams
            del buf

    def receive(self, layout: Layout) -> dict[str, torch.Tensor]:
        """Other ranks: the broadcast state, in host memory (each bucket is moved off
        the device as it arrives), ready to verify and load."""
        host = []
        for dtype, n in layout.buckets:
            buf = torch.empty(n, dtype=getattr(torch, dtype), device=self.device)
            self.pg.broadcast(buf, 0).wait()
            host.append(buf.cpu() if buf.is_cuda else buf)
            del buf
        return unpack(host, layout)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # a broken group: dropping it is all
            self.pg.abort()


class WeightGroupMember:
    """Membership of the weight-broadcast group (``train.weights.transport:
    collective``): learner rank 0 and every rollout worker. A restarted actor holds
    none, which is how the driver knows to form the group again."""

    cfg: G2RPOConfig
    _weights = None

    def weight_group(self) -> str | None:
        return None if self._weights is None else self._weights.name

    def join_weight_group(self, name: str, address: str, rank: int, world: int) -> None:
        self.leave_weight_group()
        from ..cluster.timeouts import collective_timeout_s

        timeout = collective_timeout_s(self.cfg)
        self._weights = WeightGroup(name, address, rank, world, self.cfg.model.device, timeout)

    def leave_weight_group(self) -> None:
        if self._weights is not None:
            self._weights.close()
            self._weights = None
