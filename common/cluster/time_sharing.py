"""Colocated time-sharing (``train.placement: colocated``): a rollout worker and a learner
rank take one GPU in turns, each moving what ``train.offload`` says it keeps on the host
while the other computes. The moves both sides make.

Where state moves, it moves into host buffers allocated at the first offload and reused
at every later one (``HostMirror``: pinned on CUDA, so both directions are DMA copies
issued with ``non_blocking``), and the device is synchronised once per move, before
anything reads what moved: before the device's blocks are freed for the other side
(offload) and before the side computes again (onload). The module's ``Parameter``
objects stay the same (torch's swap_tensors conversion; an optimizer holds them), and
FSDP2's sharded parameters keep their padded storage: the whole padded shard goes to the
host buffer and FSDP2's record of it follows (``_fsdp_records``), so FSDP2 never re-pads
it into a fresh, unpinned copy."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

HOST = torch.device("cpu")
# what each train.offload value moves to the host (an unresolved "auto" moves all of it:
# the least device memory, as before the plan chose; planning/offload_choice.py resolves it)
LEARNER_PARTS = {
    "none": (),
    "optimizer": ("optimizer",),
    "all": ("optimizer", "weights"),
    "auto": ("optimizer", "weights"),
}
WORKER_PARTS = {"none": (), "all": ("transformer",), "auto": ("transformer",)}


def empty_device_cache(device: torch.device) -> None:
    """Give the device's cached, unused blocks back (what the other side will allocate
    is then free to it; the caching allocator would otherwise keep them for this
    process)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def synchronize(device: torch.device) -> None:
    """Wait for the copies issued with ``non_blocking`` on ``device`` (none elsewhere)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class HostMirror:
    """The host side of what one side offloads: one buffer per tensor slot (a name that
    stays the same from turn to turn), allocated at the first offload and reused at every
    later one; pinned when the device is CUDA. ``allocations`` counts the buffers made (a
    test sees reuse)."""

    def __init__(self, device: str | torch.device) -> None:
        self.device = torch.device(device)
        self.pinned = self.device.type == "cuda"
        self._buffers: dict[str, torch.Tensor] = {}
        self.allocations = 0

    def buffer(self, key: str, like: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(key)
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype:
            buf = torch.empty(like.shape, dtype=like.dtype, device=HOST, pin_memory=self.pinned)
            self._buffers[key] = buf
            self.allocations += 1
        return buf

    def holds(self, key: str, t: torch.Tensor) -> bool:
        """``t`` lies in this slot's host buffer (it is offloaded)."""
        buf = self._buffers.get(key)
        return buf is not None and t.device.type == "cpu" and _storage_ptr(t) == _storage_ptr(buf)

    def to_host(self, key: str, t: torch.Tensor) -> torch.Tensor:
        """``t``'s values in slot ``key``'s buffer (copy issued, not waited for), as a new
        tensor object viewing it: ``Module._apply`` swaps a gradient's contents with what it
        is given, which must never be the buffer itself."""
        if self.holds(key, t):
            return t
        buf = self.buffer(key, t)
        buf.copy_(t, non_blocking=True)
        return buf.detach()

    def to_device(self, key: str, t: torch.Tensor, device: torch.device) -> torch.Tensor:
        """A new device tensor with slot ``key``'s values (when ``t`` is offloaded)."""
        if not self.holds(key, t):
            return t  # resident already
        out = torch.empty_like(t, device=device)
        out.copy_(t, non_blocking=True)
        return out

    def move(self, key: str, t: torch.Tensor, device: torch.device | None) -> torch.Tensor:
        """``to_host`` (``device`` None) or ``to_device``."""
        return self.to_host(key, t) if device is None else self.to_device(key, t, device)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())


def _fsdp_records(module: torch.nn.Module) -> dict[int, object]:
    """FSDP2's record of each sharded parameter (id of the parameter -> its FSDPParam),
    for those whose padded shard can move whole; empty without FSDP2. Read from FSDP2's
    own state as its ``_apply`` reads it; a torch whose FSDP2 keeps other fields gets
    none here, and FSDP2 then re-pads each moved shard itself (correct, one copy more)."""
    out: dict[int, object] = {}
    for m in module.modules():
        state_of = getattr(m, "_get_fsdp_state", None)
        if state_of is None:
            continue
        for group in getattr(state_of(), "_fsdp_param_groups", None) or []:
            for record in group.fsdp_params:
                padded = getattr(record, "_sharded_param_data", None)
                placement = getattr(record, "fsdp_placement", None)
                if (
                    isinstance(padded, torch.Tensor)
                    and padded.numel() > 0
                    and getattr(placement, "dim", None) == 0
                    and hasattr(record, "padded_sharded_param_size")
                ):
                    out[id(record.sharded_param)] = record
    return out


def _as_dtensor_like(local: torch.Tensor, like) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        local, like.device_mesh, like.placements, run_check=False, shape=like.shape,
        stride=like.stride(),
    )  # fmt: skip


def _move_one(t, key: str, mirror: HostMirror, device: torch.device | None, record=None):
    """``t`` (a tensor or a DTensor) offloaded into ``mirror`` (``device`` None) or
    brought back to ``device``; ``record``: FSDP2's record of a sharded parameter."""
    local = getattr(t, "_local_tensor", None)
    if local is None:
        return mirror.move(key, t, device)
    if record is None:
        moved = mirror.move(key, local, device)
        return t if moved is local else _as_dtensor_like(moved, t)
    # a sharded parameter: its whole padded shard moves, and FSDP2's record of it with it
    padded = record._sharded_param_data
    moved = mirror.move(key, padded, device)
    if moved is padded:
        return t
    record._sharded_param_data = moved  # FSDP2's _apply then sees its own storage: no re-pad
    view = moved.view(record.padded_sharded_param_size).narrow(0, 0, local.size(0))
    return _as_dtensor_like(view, t)


def move_module(
    module: torch.nn.Module, mirror: HostMirror, device: torch.device | None, prefix: str = ""
) -> None:
    """Every parameter, gradient and buffer of ``module`` into ``mirror``'s host buffers
    (``device`` None) or back onto ``device``, keeping every Parameter object (an
    optimizer holds them, and the learner's list of trained ones): torch's swap_tensors
    conversion, which FSDP2's sharded parameters take anyway (``FSDPModule._apply``).
    ``prefix`` names the module's slots in a mirror that holds several modules. The
    copies are issued, not waited for: ``synchronize`` before use."""
    names: dict[int, str] = {}
    for name, p in module.named_parameters():
        names[id(p)] = prefix + name
        if p.grad is not None:
            names[id(p.grad)] = prefix + name + ".grad"
    for name, b in module.named_buffers():
        names[id(b)] = prefix + name
    records = _fsdp_records(module)

    def moved(t: torch.Tensor) -> torch.Tensor:
        key = names.get(id(t))
        if key is None:  # a tensor _apply reaches that named_* did not list
            raise RuntimeError(f"{type(module).__name__}: a {tuple(t.shape)} tensor has no name")
        return _move_one(t, key, mirror, device, records.get(id(t)))

    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        module._apply(moved)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)


def move_optimizer_state(
    optimizer: torch.optim.Optimizer,
    mirror: HostMirror,
    device: torch.device | None,
    names: dict[int, str] | None = None,
) -> None:
    """Every per-parameter tensor of ``optimizer``'s state (AdamW's moments) into
    ``mirror`` (``device`` None) or back onto ``device``; its ``step`` counters stay where
    the optimizer keeps them (a CPU scalar unless ``capturable``). ``names``: id of a
    parameter -> its name (the slots' names; the parameter's index otherwise)."""
    order = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    for param, state in optimizer.state.items():
        slot = (names or {}).get(id(param)) or f"#{order.get(id(param))}"
        for key, value in state.items():
            if torch.is_tensor(value) and key != "step":
                state[key] = _move_one(value, f"optimizer/{slot}/{key}", mirror, device)


def device_bytes(tensors, device_type: str) -> int:
    """Bytes of ``tensors`` that lie on a device of ``device_type`` (what a phase left
    behind there)."""
    return sum(t.numel() * t.element_size() for t in tensors if t.device.type == device_type)


class DeviceTurn:
    """One side of a colocated pair: the parts it keeps, each on ``device`` or on the
    host while the other side has the GPU. ``move(device, parts)`` moves the named parts
    to ``device`` (the host: ``HOST``) and returns once they are there (synchronised).
    ``offloaded``: the parts ``train.offload`` sends to the host (the others stay
    resident). On a CPU run there is nothing to move. Each move returns its seconds (0
    when there was none to make)."""

    def __init__(
        self,
        device: str | torch.device,
        move: Callable[[torch.device, tuple[str, ...]], None],
        offloaded: tuple[str, ...],
    ) -> None:
        self.device = torch.device(device)
        self._move = move
        self.offloaded = tuple(offloaded)
        self.on_host: set[str] = set()
        self.offload_s = 0.0  # this turn's offloads' seconds (from the first part moved)

    def offload(self, parts: tuple[str, ...] | None = None) -> float:
        """The offloaded parts (of ``parts``, when given) to the host, then the device's
        cached blocks freed for the other side; the cache is emptied even when no part
        moves (``train.offload`` none): it holds the phase's freed activations."""
        if self.device.type == "cpu":
            return 0.0
        wanted = self.offloaded if parts is None else parts
        todo = tuple(p for p in self.offloaded if p in wanted and p not in self.on_host)
        new_turn = not self.on_host
        t0 = time.perf_counter()
        if todo:
            self._move(HOST, todo)
            self.on_host.update(todo)
        empty_device_cache(self.device)
        seconds = time.perf_counter() - t0 if todo else 0.0
        self.offload_s = seconds if new_turn else self.offload_s + seconds
        return seconds

    def resident(self, parts: tuple[str, ...] | None = None) -> float:
        """The parts on the host (of ``parts``, when given) back on the device (else a
        no-op); its seconds."""
        todo = tuple(p for p in self.offloaded if p in self.on_host and (not parts or p in parts))
        if not todo:
            return 0.0
        t0 = time.perf_counter()
        self._move(self.device, todo)
        self.on_host.difference_update(todo)
        return time.perf_counter() - t0
