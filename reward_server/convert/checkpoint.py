"""Reading an original reward checkpoint and accounting for every tensor in it.

A conversion takes each original tensor exactly once; a missing tensor or one of
the wrong shape refuses the checkpoint, naming the keys, and tensors the mapping
does not know are reported (never silently dropped).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...common.errors import G2RPOError, ModelPathError


class CheckpointMismatch(G2RPOError, ValueError):
    """An original checkpoint that does not have the layout the conversion expects."""


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.pt``/``.bin`` (plain, or under ``state_dict``) or ``.safetensors``
    file, with a DataParallel ``module.`` prefix removed."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelPathError(f"checkpoint {str(path)!r} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        obj = load_file(str(path))
    else:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # truncated file, pickle with code objects, ...
            raise CheckpointMismatch(f"{path}: not a readable torch checkpoint ({exc})") from None
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointMismatch(f"{path}: expected a dict of tensors (a state dict)")
    if obj and all(k.startswith("module.") for k in obj):
        obj = {k[len("module.") :]: v for k, v in obj.items()}
    return obj


class TensorLedger:
    """Hands out the original tensors by key, each at most once, and reports the rest."""

    def __init__(self, state: dict[str, torch.Tensor], what: str, ignorable: tuple[str, ...] = ()):
        self.state = state
        self.what = what
        self.ignorable = ignorable  # key suffixes of buffers that carry no weights
        self.taken: set[str] = set()
        self.missing: list[str] = []
        self.wrong_shape: list[str] = []

    def has(self, key: str) -> bool:
        return key in self.state

    def take(self, key: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        if key in self.taken:
            raise AssertionError(f"{key} taken twice")  # a bug in the mapping, not the input
        if key not in self.state:
            self.missing.append(key)
            return torch.empty(0)
        tensor = self.state[key]
        if shape is not None and tuple(tensor.shape) != tuple(shape):
            self.wrong_shape.append(f"{key} {list(tensor.shape)} (expected {list(shape)})")
        self.taken.add(key)
        return tensor

    def count(self, prefix: str, suffix: str) -> int:
        """How many consecutive blocks ``prefix{i}suffix`` exist from i = 0."""
        n = 0
        while f"{prefix}{n}{suffix}" in self.state:
            n += 1
        return n

    def finish(self) -> list[str]:
        """Refuse a checkpoint with missing or mis-shaped tensors; return the keys left over."""
        problems = []
        if self.missing:
            problems.append(f"missing {len(self.missing)} tensor(s): {_head(self.missing)}")
        if self.wrong_shape:
            problems.append(f"wrong shape: {_head(self.wrong_shape)}")
        if problems:
            raise CheckpointMismatch(
                f"{self.what}: this checkpoint does not have the expected layout — "
                + "; ".join(problems)
            )
        return sorted(
            k for k in self.state if k not in self.taken and not k.endswith(self.ignorable)
        )


def _head(items: list[str], n: int = 8) -> str:
    more = f" … and {len(items) - n} more" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def require(state: dict[str, torch.Tensor], key: str, what: str) -> torch.Tensor:
    """A tensor the architecture is inferred from: refuse at once when it is absent."""
    if key not in state:
        raise CheckpointMismatch(f"{what}: missing tensor {key} — is this the right checkpoint?")
    return state[key]
