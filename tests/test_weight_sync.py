"""The weight broadcast's own group (train.weights.transport: collective): the bucket
layout, and a real gloo broadcast between processes, including a member that dies."""

import multiprocessing as mp
import time

import torch
from g2rpo.common.cluster.net import free_port
from g2rpo.common.wire.weight_sync import WeightGroup, layout_of, pack, unpack
from g2rpo.common.wire.weights import weights_checksum


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a": torch.arange(6.0).view(2, 3),
        "b": torch.randn(4, generator=g).to(torch.bfloat16),
        "c": torch.randn(1000, generator=g),
        "d": torch.randn(2, 5, generator=g),
    }


def test_layout_buckets_by_dtype_and_size_and_unpacks_to_the_same_bytes():
    state = _state()
    layout = layout_of(state, bucket_bytes=1024)
    # name order; a new bucket whenever the dtype's open one would pass 1024 bytes
    assert layout.buckets == (("float32", 6), ("bfloat16", 4), ("float32", 1000), ("float32", 10))
    assert [(s.name, s.bucket, s.offset) for s in layout.slots] == [
        ("a", 0, 0),
        ("b", 1, 0),
        ("c", 2, 0),
        ("d", 3, 0),
    ]
    assert layout.nbytes == 4 * 6 + 2 * 4 + 4 * 1000 + 4 * 10
    one_bucket = layout_of(state)  # default 256 MiB: one bucket per dtype
    assert one_bucket.buckets == (("float32", 1016), ("bfloat16", 4))
    for lay in (layout, one_bucket):
        back = unpack(pack(state, lay, "cpu"), lay)
        assert weights_checksum(back) == weights_checksum(state)
        assert all(
            back[k].dtype == state[k].dtype and back[k].shape == state[k].shape for k in state
        )


def _member(rank: int, world: int, address: str, die: bool, results) -> None:
    torch.set_num_threads(1)
    state = _state()
    layout = layout_of(state, bucket_bytes=1024)
    group = WeightGroup("t", address, rank, world, "cpu", timeout_s=60)
    t0 = time.monotonic()
    try:
        if rank == 0:
            group.send(state, layout)
            results.put((rank, "sent", time.monotonic() - t0))
        else:
            if die and rank == 1:
                import os

                os._exit(3)  # a worker that dies before the broadcast reaches it
            got = group.receive(layout)
            results.put((rank, weights_checksum(got), time.monotonic() - t0))
    except RuntimeError as exc:
        results.put((rank, f"error: {str(exc)[:80]}", time.monotonic() - t0))


def _broadcast(die: bool) -> dict:
    # each member a fresh process (no thread of pytest's forked): a fork server that
    # imported torch once forks them, instead of 6 spawned processes importing it each
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "g2rpo.common.wire.weight_sync", __name__])
    results = ctx.Queue()
    address = f"127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_member, args=(r, 3, address, die, results)) for r in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    out = {}
    while not results.empty():
        rank, what, seconds = results.get()
        out[rank] = (what, seconds)
    return out


def test_broadcast_reaches_every_member_and_a_dead_member_fails_the_rest_fast():
    out = _broadcast(die=False)
    want = weights_checksum(_state())
    assert out[0][0] == "sent" and out[1][0] == want and out[2][0] == want

    out = _broadcast(die=True)
    assert 1 not in out  # it died
    # the sender sees the dead peer's closed connection instead of waiting out the
    # 60 s timeout; the driver then falls back to the object store
    assert out[0][0].startswith("error") and out[0][1] < 30
