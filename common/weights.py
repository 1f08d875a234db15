"""Published weights: their checksum, their size on the wire, and the verified load
a rollout worker does (the contract between the learner and its workers)."""

from __future__ import annotations

import hashlib

import torch

from .lora import AdapterMismatch, load_adapter_state


class WeightMismatch(RuntimeError):
    """Published weights whose checksum does not match what arrived."""


def weights_checksum(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        # the raw bytes (numpy has no bfloat16)
        raw = state[name].detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        h.update(raw.numpy().tobytes())
    return h.hexdigest()[:16]


def state_nbytes(state: dict[str, torch.Tensor]) -> int:
    """The bytes a published state puts on the wire."""
    return sum(t.numel() * t.element_size() for t in state.values())


def load_published(
    transformer: torch.nn.Module, version: int, state: dict, checksum: str, lora: bool
) -> None:
    """Verify a published version's checksum, then load it strictly: the adapters of
    a LoRA run, else every weight."""
    got = weights_checksum(state)
    if got != checksum:
        raise WeightMismatch(f"weights v{version}: checksum {got} != published {checksum}")
    if lora:
        try:
            load_adapter_state(transformer, state)
        except AdapterMismatch as exc:
            raise WeightMismatch(f"weights v{version}: {exc}") from None
    else:
        transformer.load_state_dict(state)
