"""The fastest SDPA kernel for a rollout, measured where it runs
(``model.rollout_attention_backend: fastest``): the shape of the transformer's first
attention call, each single kernel timed forward-only at it on the worker's device, the
fastest that runs chosen. A rollout never backpropagates, so a kernel refused for the
learner (cuDNN's backward, ``transformer_call.sdpa_backends``) may win here.

On CPU the same measurement runs: torch has two CPU kernels (flash's CPU
implementation and math); efficient and cuDNN cannot run there and time as None."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

SINGLE_KERNELS = ("flash", "efficient", "cudnn", "math")  # model.attention_backend values


@dataclass(frozen=True)
class AttentionShape:
    """Query, key and value shapes ([batch, heads, tokens, head dim]) and dtype of one
    scaled_dot_product_attention call."""

    query: tuple[int, ...]
    key: tuple[int, ...]
    value: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    def as_dict(self) -> dict:
        return {
            "query": list(self.query),
            "key": list(self.key),
            "value": list(self.value),
            "dtype": str(self.dtype).removeprefix("torch."),
        }


class _Seen(Exception):
    def __init__(self, shape: AttentionShape) -> None:
        self.shape = shape


class _FirstAttention(torch.overrides.TorchFunctionMode):
    """Stops a forward at its first SDPA call, with that call's shapes."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.nn.functional.scaled_dot_product_attention:
            given = kwargs or {}
            q, k, v = (
                given[n] if n in given else args[i] for i, n in enumerate(("query", "key", "value"))
            )
            shapes = (tuple(t.shape) for t in (q, k, v))
            raise _Seen(AttentionShape(*shapes, dtype=q.dtype, device=q.device))
        return func(*args, **(kwargs or {}))


def first_attention_shape(forward: Callable[[], object]) -> AttentionShape | None:
    """Run ``forward`` eagerly (compiled blocks too) up to its first SDPA call; that
    call's shape (None if it makes none). Only the layers before it run."""
    try:
        with torch.compiler.set_stance("force_eager"), _FirstAttention():
            forward()
    except _Seen as seen:
        return seen.shape
    return None


def time_kernels(shape: AttentionShape, repeats: int = 5) -> dict[str, float | None]:
    """Median seconds of one forward SDPA call at ``shape`` (no mask) for each single
    kernel, on ``shape.device``; None where the kernel cannot run there (its error)."""
    from torch.nn.attention import sdpa_kernel

    from .transformer_call import sdpa_backends

    gen = torch.Generator(device=shape.device).manual_seed(0)
    q, k, v = (
        torch.randn(s, generator=gen, device=shape.device, dtype=torch.float32).to(shape.dtype)
        for s in (shape.query, shape.key, shape.value)
    )
    times: dict[str, float | None] = {}
    for name in SINGLE_KERNELS:
        try:
            with torch.inference_mode(), sdpa_kernel(sdpa_backends(name)):
                torch.nn.functional.scaled_dot_product_attention(q, k, v)  # warm-up
                laps = []
                for _ in range(repeats):
                    _sync(shape.device)
                    t0 = time.perf_counter()
                    torch.nn.functional.scaled_dot_product_attention(q, k, v)
                    _sync(shape.device)
                    laps.append(time.perf_counter() - t0)
            times[name] = statistics.median(laps)
        except RuntimeError:
            times[name] = None  # no such kernel here, or not for this shape/dtype
    return times


def fastest(times: dict[str, float | None]) -> str:
    """The kernel with the least time among those that ran (ties: SINGLE_KERNELS's
    order); refused when none ran."""
    ran = [(t, SINGLE_KERNELS.index(n), n) for n, t in times.items() if t is not None]
    if not ran:
        raise RuntimeError(
            "model.rollout_attention_backend fastest: no SDPA kernel ran at the rollout's "
            f"attention shape ({times}); set model.rollout_attention_backend to a kernel"
        )
    return min(ran)[2]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
