"""Published weights: their checksum, their size on the wire, and the verified load
a rollout worker does (the contract between the learner and its workers).

The checksum is XXH3-128 (``xxhash``) over, for each tensor in name order, a header
``json.dumps([name, dtype, shape])`` + newline, then the tensor's bytes in row-major
order, read through a zero-copy ``uint8`` view (numpy has no bfloat16; a byte view
needs none). So it covers the names (a missing or extra tensor), each dtype and
shape (a misshapen tensor, even with the same bytes) and every byte; it does not
depend on the dict's order, a tensor's strides (a non-contiguous tensor hashes as
its contiguous copy) or its device. The version is not in it: a worker reports
(version, checksum) and the driver compares both (``publishing.check_loaded``); a
wrong version's state fails the checksum of the version it was published as.

Why this and not the alternatives, at FLUX.1-dev size (12B parameters, 24-48 GB):

* SHA-256, as before, verified at ~1.1 s/GB on our CPU (the Python ``tobytes()``
  copy plus hashing): about a minute per side per version at fp32. A cryptographic
  hash defends against a forger; here the threat is a torn, stale or mixed-up
  transfer, which a 128-bit non-cryptographic hash misses with probability 2^-128.
  XXH3 runs near memory bandwidth: ~0.045 s/GB here, 25x faster and under a tenth
  of the host copy the learner makes anyway (``g2rpo bench weights --verify-gb 1``,
  ``docs/benchmarks.md``).
* A checksum in torch ops on the tensor's device would spare a GPU the copy to the
  host, but both sides verify host bytes already: the learner publishes a host copy
  (the object store's, and the one kept for a restarted worker), and a worker
  receives into host memory (the object store's, or each broadcast bucket moved off
  the device so that the device never holds the model twice). It would also be a
  hand-written hash that must agree bit for bit between CPU and CUDA kernels.
* NCCL's own integrity (link CRCs, ECC) says nothing about the object-store path,
  about which version arrived, or about a bucket unpacked into the wrong slot.

Tensors on a device are copied to the host one at a time to be hashed.

A version crosses Ray as NumPy arrays (``common/wire/shared_tensors.py``): a worker gets
read-only views of its node's one object-store copy, hashes them where they lie and
copies them into its own weights (on the host, or host view to device), never
holding a private copy of the version (``load_published``)."""

from __future__ import annotations

import json

import torch
import xxhash

from ..families.lora import AdapterMismatch, load_adapter_state
from .shared_tensors import WEIGHTS_SHARE_FROM_BYTES, from_wire, to_wire


class WeightMismatch(RuntimeError):
    """Published weights whose checksum does not match what arrived."""


def tensor_header(name: str, tensor: torch.Tensor) -> bytes:
    """What the checksum hashes before a tensor's bytes: its name, dtype and shape."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    return json.dumps([name, dtype, list(tensor.shape)]).encode() + b"\n"


def tensor_bytes(tensor: torch.Tensor):
    """The tensor's bytes in row-major order as a zero-copy numpy ``uint8`` view (a
    copy only for a non-contiguous or device tensor)."""
    t = tensor.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy()


def weights_checksum(state: dict[str, torch.Tensor]) -> str:
    """XXH3-128 of the state's names, dtypes, shapes and bytes (module docstring)."""
    h = xxhash.xxh3_128()
    for name in sorted(state):
        h.update(tensor_header(name, state[name]))
        h.update(tensor_bytes(state[name]))
    return h.hexdigest()


def state_nbytes(state: dict[str, torch.Tensor]) -> int:
    """The bytes a published state puts on the wire."""
    return sum(t.numel() * t.element_size() for t in state.values())


def publishable(state: dict[str, torch.Tensor]) -> dict:
    """A version as it goes into the object store (``ray.put``): its large tensors as
    NumPy arrays, which every worker on a node maps instead of unpickling a copy. The
    arrays view ``state``'s tensors: the put is the only copy. Tensors under 16 KiB (a
    norm's scale, a bias) are pickled as they are."""
    return to_wire(state, WEIGHTS_SHARE_FROM_BYTES)


def load_published(
    transformer: torch.nn.Module, version: int, state: dict, checksum: str, lora: bool
) -> None:
    """Verify a published version's checksum, then load it strictly: the adapters of
    a LoRA run, else every weight. ``state``: tensors, or the object store's form of
    them (``publishable``), hashed and copied from where they lie (read-only views of
    the store's shared memory: ``load_state_dict`` copies out of them, never into)."""
    state = from_wire(state)
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
