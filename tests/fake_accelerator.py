"""A stand-in accelerator for catching CPU/accelerator device mixing on a CPU-only torch.

CI has no GPU, so a tensor left on the CPU beside a model on CUDA (or a CUDA tensor
sent to a GPU-less process) is invisible to it. This module registers torch's
PrivateUse1 backend from Python under the name ``fakegpu`` and runs every op of a
``fakegpu`` tensor on the CPU inside a wrapper that *reports* ``fakegpu:0`` as its
device. A dispatch mode checks each op the way CUDA kernels do: tensors of one op
must share a device, except 0-dim CPU scalars, CPU index tensors in advanced
indexing, and the copies that move data between devices. So the code under test
runs end to end with real values (rollouts, rewards, backward, AdamW), while any
device mix raises :class:`DeviceMix` naming the op.

Why not the obvious routes: torch's ``FakeTensorMode`` does raise on mixing and
can make fake CUDA tensors, but ``nn.Module.to("cuda")`` fails on a CPU build,
autograd aborts the process on a fake CUDA parameter (no CUDA device guard), and
fake tensors have no values, so any data-dependent step (``bool(t.any())``,
``torch.unique``, decoding images for a reward) cannot run. The PrivateUse1 route
has a Python device guard, so autograd works.

Use ``with on_fake_gpu():`` around the code under test; the device is
:data:`FAKE_GPU` (``model.device: fakegpu``). The backend name is registered on
import, once per process.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

NAME = "fakegpu"
aten = torch.ops.aten

# ops whose tensors may sit on different devices on CUDA too
_COPIES = {aten._to_copy.default, aten.copy_.default}
# advanced indexing takes CPU index tensors for a tensor on the device
_INDEXING = {
    aten.index.Tensor,
    aten.index_put.default,
    aten.index_put_.default,
    aten._index_put_impl_.default,
}


class DeviceMix(RuntimeError):
    """An op given tensors on different devices (CUDA would refuse it too)."""


_active = [False]  # the device exists only inside on_fake_gpu()


class _Backend:
    """What torch asks of a device module (autocast, RNG, device queries). Outside
    ``on_fake_gpu()`` it reports no device, so the rest of a test process (e.g.
    ``torch.accelerator.current_accelerator()`` in ``fork_rng``) never sees it."""

    @staticmethod
    def is_available() -> bool:
        return _active[0]

    @staticmethod
    def device_count() -> int:
        return int(_active[0])

    @staticmethod
    def get_rng_state(device=None) -> torch.Tensor:
        return torch.get_rng_state()  # the device computes on the CPU's generator

    @staticmethod
    def set_rng_state(state: torch.Tensor, device=None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def get_amp_supported_dtype() -> list:
        return [torch.float16, torch.bfloat16]

    @staticmethod
    def is_autocast_enabled() -> bool:
        return False

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        pass


def _register() -> None:
    if getattr(torch._C, "_get_privateuse1_backend_name", lambda: "")() == NAME:
        return
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(rename=NAME, backend_module=_Backend())


_register()  # the device name exists from import on (once per process)
FAKE_GPU = torch.device(NAME, 0)


class OnFakeGpu(torch.Tensor):
    """A CPU tensor (``inner``) that reports itself on ``fakegpu:0``."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        out = torch.Tensor._make_wrapper_subclass(
            cls,
            inner.shape,
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            device=FAKE_GPU,
            requires_grad=False,
        )
        out.inner = inner
        return out

    def __repr__(self) -> str:
        return f"OnFakeGpu({self.inner!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise DeviceMix(f"{func}: a fakegpu tensor used outside on_fake_gpu()")


def _is_fake_gpu(device) -> bool:
    return device is not None and torch.device(device).type == NAME


def _devices(func, args, kwargs) -> set[str]:
    """The devices an op's tensors are on, as CUDA's checks would count them."""
    seen: set[str] = set()

    def look(t):
        if isinstance(t, OnFakeGpu):
            seen.add(NAME)
        elif isinstance(t, torch.Tensor) and not (t.dim() == 0 and t.device.type == "cpu"):
            seen.add(t.device.type)
        return t

    if func in _INDEXING:  # only self and values count; indices may be CPU tensors
        tree_map(look, [args[0], *args[2:]])
    else:
        tree_map(look, (args, kwargs))
    return seen


class _FakeGpuMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        devices = _devices(func, args, kwargs)
        if len(devices) > 1 and func not in _COPIES:
            raise DeviceMix(f"{func}: tensors on {' and '.join(sorted(devices))}")
        # a target device, as a keyword or (aten.to.device) a positional torch.device
        targets = [a for a in args if isinstance(a, torch.device)]
        if kwargs.get("device") is not None:
            targets.append(torch.device(kwargs["device"]))
        if targets:
            to_gpu = _is_fake_gpu(targets[-1])
            gen = kwargs.get("generator")
            if to_gpu and gen is not None and gen.device.type != NAME:
                raise DeviceMix(f"{func}: a {gen.device.type} generator for a {NAME} tensor")
            cpu = torch.device("cpu")
            args = tuple(cpu if isinstance(a, torch.device) else a for a in args)
            if "device" in kwargs:
                kwargs["device"] = cpu
        elif func is aten.copy_.default:
            to_gpu = isinstance(args[0], OnFakeGpu)
        else:
            to_gpu = NAME in devices
        plain_args, plain_kwargs = tree_map(
            lambda t: t.inner if isinstance(t, OnFakeGpu) else t, (args, kwargs)
        )
        out = func(*plain_args, **plain_kwargs)
        if func._schema.is_mutable and args and isinstance(args[0], OnFakeGpu):
            return args[0]  # in place: the wrapper's inner tensor changed
        if not to_gpu:
            return out
        # wrappers are made as normal tensors even in inference mode: a view of a
        # normal tensor taken in inference mode shares its version counter, which an
        # inference tensor cannot have
        with torch.inference_mode(False):
            return tree_map(lambda t: OnFakeGpu(t) if type(t) is torch.Tensor else t, out)


class _TensorFromData(TorchFunctionMode):
    """``torch.tensor(data, device=...)`` builds its tensor in C++ below the dispatch
    modes: build it on the CPU, then move it, which the dispatch mode sees."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.tensor, torch.as_tensor) and _is_fake_gpu(kwargs.get("device")):
            device = kwargs.pop("device")
            return func(*args, **kwargs).to(device)
        return func(*args, **kwargs)


@contextmanager
def on_fake_gpu():
    """Run the block with ``fakegpu`` tensors computed on the CPU and device mixing
    checked op by op."""
    _active[0] = True
    try:
        with _TensorFromData(), _FakeGpuMode():
            yield FAKE_GPU
    finally:
        _active[0] = False
