"""Large CPU tensors pickled as NumPy arrays, so that Ray shares them on a node.

Ray deserialises a NumPy array as a read-only view of the object store's shared
memory, while a torch tensor is unpickled into a private copy of its bytes. A
learner rank that received every worker's trajectory batch therefore held a
private copy of all of them (two ranks on a node: twice the batches, plus the
store's own copy; `grpo_guard_sd35`'s rehearsal ran out of host memory on it).
Pickled through here, the ranks of a node read one copy in the store.

Published weight versions cross the same way (``Learner.publish``, the collective
transport's object-store copies, ``common/wire/weights.load_published``): at FLUX size a
version is 23.8 GB, and seven workers on a node each unpickling a private copy held
167 GB more than the store's one (``g2rpo bench weights-memory`` measures it).

The tensors that come back are views of read-only memory: the learner only
indexes them (which copies the rows it takes), a worker only hashes them and copies
them into its own weights (``load_state_dict``), and neither writes into them.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

# below this a tensor is pickled as it is: Ray's out-of-band buffers cost more
# than they save on a 1-D index tensor
SHARE_FROM_BYTES = 1 << 20
# a weight version's threshold: a LoRA run's adapters are many tensors of tens to
# hundreds of KiB (FLUX at rank 16: 3072 x 16 x 4 B = 192 KiB each), together up to GBs
WEIGHTS_SHARE_FROM_BYTES = 16 << 10

# dtypes NumPy has no type for travel as integers of the same width
_CARRIERS = {
    torch.bfloat16: torch.int16,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e5m2: torch.uint8,
}


class _SharedArray:
    """A pickled tensor: its bytes as a NumPy array and the dtype to view them as."""

    __slots__ = ("array", "dtype")

    def __init__(self, array: np.ndarray, dtype: torch.dtype) -> None:
        self.array = array
        self.dtype = dtype

    def __reduce__(self):
        return (_SharedArray, (self.array, self.dtype))

    def tensor(self) -> torch.Tensor:
        with warnings.catch_warnings():
            # read-only by design: see the module's docstring
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            t = torch.from_numpy(self.array)
        return t.view(self.dtype) if t.dtype != self.dtype else t


def to_wire(value: Any, share_from: int = SHARE_FROM_BYTES) -> Any:
    """``value`` with a CPU tensor of at least ``share_from`` bytes (or such tensors of
    a dict) replaced by its shareable form; anything else unchanged."""
    if isinstance(value, dict):
        return {k: to_wire(v, share_from) for k, v in value.items()}
    if (
        not isinstance(value, torch.Tensor)
        or value.device.type != "cpu"
        or value.requires_grad
        or value.numel() * value.element_size() < share_from
    ):
        return value
    t = value.detach().contiguous()
    carrier = _CARRIERS.get(t.dtype)
    array = (t.view(carrier) if carrier is not None else t).numpy()
    return _SharedArray(array, t.dtype)


def from_wire(value: Any) -> Any:
    """The inverse of ``to_wire``: tensors viewing the received arrays."""
    if isinstance(value, dict):
        return {k: from_wire(v) for k, v in value.items()}
    return value.tensor() if isinstance(value, _SharedArray) else value


class SharedWhenPickled:
    """A mixin for dataclasses that cross Ray: large tensor fields (and dict fields of
    tensors) are pickled through ``to_wire`` and come back as shared views."""

    def __getstate__(self) -> dict:
        return {k: to_wire(v) for k, v in self.__dict__.items()}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update({k: from_wire(v) for k, v in state.items()})
