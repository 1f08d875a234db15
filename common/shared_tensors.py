"""Large CPU tensors pickled as NumPy arrays, so that Ray shares them on a node.

Ray deserialises a NumPy array as a read-only view of the object store's shared
memory, while a torch tensor is unpickled into a private copy of its bytes. A
learner rank that received every worker's trajectory batch therefore held a
private copy of all of them (two ranks on a node: twice the batches, plus the
store's own copy; `grpo_guard_sd35`'s rehearsal ran out of host memory on it).
Pickled through here, the ranks of a node read one copy in the store.

The tensors that come back are views of read-only memory: the learner only
indexes them (which copies the rows it takes) and never writes into them.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

# below this a tensor is pickled as it is: Ray's out-of-band buffers cost more
# than they save on a 1-D index tensor
SHARE_FROM_BYTES = 1 << 20

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


def to_wire(value: Any) -> Any:
    """``value`` with a large CPU tensor (or the large tensors of a dict) replaced by
    its shareable form; anything else unchanged."""
    if isinstance(value, dict):
        return {k: to_wire(v) for k, v in value.items()}
    if (
        not isinstance(value, torch.Tensor)
        or value.device.type != "cpu"
        or value.requires_grad
        or value.numel() * value.element_size() < SHARE_FROM_BYTES
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
