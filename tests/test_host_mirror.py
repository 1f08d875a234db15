"""Where colocated state moves (common/cluster/time_sharing.py): into host buffers allocated at
the first offload and reused at every later one, the module's Parameter objects kept,
an optimizer's moments beside them, and FSDP2's padded shards moved whole, so FSDP2 keeps
the host buffer instead of re-padding each shard into a fresh copy. The moves run here on
the CPU, the "device" side being a fresh tensor and the host side the mirror's buffer
(``DeviceTurn`` skips them on a CPU run; on CUDA the buffers are pinned). On 3bb9114 every
offload allocated new host tensors (``module.to``) and there was no HostMirror."""

from __future__ import annotations

import copy

import torch
from g2rpo.common.cluster.time_sharing import HostMirror, move_module, move_optimizer_state

CPU = torch.device("cpu")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.LayerNorm(7))
    model.register_buffer("scale", torch.tensor([2.0]))
    return model


def _step(model, optimizer) -> None:
    x = torch.arange(10.0).reshape(2, 5)
    (model(x) * model.scale).square().mean().backward()
    optimizer.step()


def _offload(model, optimizer, mirror) -> None:
    names = {id(p): n for n, p in model.named_parameters()}
    move_module(model, mirror, None)
    move_optimizer_state(optimizer, mirror, None, names)


def _onload(model, optimizer, mirror) -> None:
    names = {id(p): n for n, p in model.named_parameters()}
    move_module(model, mirror, CPU)
    move_optimizer_state(optimizer, mirror, CPU, names)


def test_state_moves_into_host_buffers_made_once_and_comes_back_unchanged():
    """Catches: a buffer allocated per offload (the count or the address would change), a
    Parameter replaced instead of swapped (the optimizer would update an orphan), moments
    left behind or mixed up (the next step would differ from a model that never moved)."""
    model, still = _model(), _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    opt_still = torch.optim.AdamW(still.parameters(), lr=0.1)
    _step(model, opt)
    _step(still, opt_still)  # (gradients kept: they move too)
    params = list(model.parameters())
    mirror = HostMirror(CPU)
    addresses = None
    for _turn in range(3):
        _offload(model, opt, mirror)
        held = {n: mirror.holds(n, p) for n, p in model.named_parameters()}
        assert all(held.values()), held  # each parameter now lies in its host buffer
        assert all(
            mirror.holds(f"optimizer/{n}/exp_avg", opt.state[p]["exp_avg"])
            for n, p in model.named_parameters()
        )
        now = sorted(b.data_ptr() for b in mirror._buffers.values())
        assert addresses in (None, now)  # the same buffers every turn
        addresses = now
        _onload(model, opt, mirror)
        assert not any(mirror.holds(n, p) for n, p in model.named_parameters())
    # 4 weights + their 4 gradients + 1 buffer + 2 moments each, made at the first turn
    assert mirror.allocations == 17
    assert list(model.parameters()) == params and all(
        a is b for a, b in zip(model.parameters(), params, strict=True)
    )
    assert set(opt.state) == set(params)
    for a, b in zip(model.state_dict().values(), still.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    _step(model, opt)
    _step(still, opt_still)
    for a, b in zip(model.parameters(), still.parameters(), strict=True):
        assert torch.equal(a, b)


def _fsdp_rank(rank: int, port: int, out: str) -> None:
    """One rank of a 2-rank gloo group: a Linear whose 5 output rows FSDP2 shards 3 + 2,
    the second rank's shard padded to 3 rows."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 5))
        still = copy.deepcopy(model)
        for m in (model, still):
            fully_shard(m)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        opt_still = torch.optim.AdamW(still.parameters(), lr=0.1)
        x = torch.arange(8.0).reshape(2, 4) + rank
        for m, o in ((model, opt), (still, opt_still)):
            m(x).square().mean().backward()
            o.step()
            o.zero_grad(set_to_none=True)
        record = model._get_fsdp_state()._fsdp_param_groups[0].fsdp_params[0]
        mirror, seen = HostMirror(CPU), []
        for _turn in range(2):
            _offload(model, opt, mirror)
            host = mirror._buffers["0.weight"]
            seen.append(
                (
                    record._sharded_param_data.data_ptr() == host.data_ptr(),
                    record.sharded_param._local_tensor.untyped_storage().data_ptr()
                    == host.data_ptr(),
                    host.numel(),
                    host.data_ptr(),
                )
            )
            _onload(model, opt, mirror)
        for m, o in ((model, opt), (still, opt_still)):
            m(x).square().mean().backward()
            o.step()
        same = all(
            torch.equal(a.full_tensor(), b.full_tensor())
            for a, b in zip(model.parameters(), still.parameters(), strict=True)
        )
        torch.save({"seen": seen, "same": same}, out.format(rank))
    finally:
        dist.destroy_process_group()


def test_fsdp2_padded_shards_move_whole_and_keep_their_host_buffer(tmp_path):
    """Catches: FSDP2 re-padding a moved shard into a copy of its own (its record would not
    point at the host buffer), a padded shard moved without its padding (the buffer would
    hold 2 rows on rank 1), and a shard that comes back wrong (the next step differs)."""
    import torch.multiprocessing as tmp
    from g2rpo.common.cluster.net import free_port

    port = free_port()
    tmp.spawn(
        _fsdp_rank,
        args=(port, str(tmp_path / "rank{}.pt")),
        nprocs=2,
        join=True,
    )
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["same"]
        first, second = got["seen"]
        assert first[:2] == (True, True) and second[:2] == (True, True)
        assert first[2] == 3 * 4  # the padded shard: 3 rows of 4 on either rank
        assert first[3] == second[3]  # the same host buffer at the second offload
