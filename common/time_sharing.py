"""Colocated time-sharing (``train.placement: colocated``): a rollout worker and a learner
rank take one GPU in turns, each moving what it keeps to the host while the other
computes. The moves both sides make."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def empty_device_cache(device: torch.device) -> None:
    """Give the device's cached, unused blocks back (what the other side will allocate
    is then free to it; the caching allocator would otherwise keep them for this
    process)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def move_module(module: torch.nn.Module, device: torch.device | str) -> None:
    """``module.to(device)`` keeping every Parameter object (an optimizer holds them, and
    the learner's list of trained ones): torch's swap_tensors conversion, which
    FSDP2's sharded parameters take anyway and which gradients follow."""
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        module.to(device)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Every per-parameter tensor of ``optimizer``'s state (AdamW's moments) to
    ``device``; its ``step`` counters stay where the optimizer keeps them (a CPU scalar
    unless ``capturable``)."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value) and key != "step":
                state[key] = value.to(device)


def device_bytes(tensors, device_type: str) -> int:
    """Bytes of ``tensors`` that lie on a device of ``device_type`` (what a phase left
    behind there)."""
    return sum(t.numel() * t.element_size() for t in tensors if t.device.type == device_type)


class DeviceTurn:
    """One side of a colocated pair: what it keeps, either on ``device`` or on the host
    while the other side has the GPU, moved by ``move(device)``. On a CPU run there is
    nothing to move. Each move returns its seconds (0 when there was none to make)."""

    def __init__(self, device: str | torch.device, move: Callable[[torch.device], None]) -> None:
        self.device = torch.device(device)
        self._move = move
        self.on_host = False
        self.offload_s = 0.0  # the last offload's seconds

    def offload(self) -> float:
        """To the host, and the device's cached blocks freed for the other side."""
        if self.device.type == "cpu" or self.on_host:
            return 0.0
        t0 = time.perf_counter()
        self._move(torch.device("cpu"))
        self.on_host = True
        empty_device_cache(self.device)
        self.offload_s = time.perf_counter() - t0
        return self.offload_s

    def resident(self) -> float:
        """Back on the device after ``offload`` (else a no-op)."""
        if not self.on_host:
            return 0.0
        t0 = time.perf_counter()
        self._move(self.device)
        self.on_host = False
        return time.perf_counter() - t0
