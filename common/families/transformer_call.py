"""How every family's transformer is called: the SDPA kernels ``model.attention_backend``
allows, autocast to the adapter's compute dtype, errors that name the backend, and the
gradient-checkpointing function whose recompute runs under the forward's kernels."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch


class AttentionBackendError(RuntimeError):
    """The transformer failed under the attention kernels ``model.attention_backend`` allows."""


def sdpa_backends(name: str) -> list:
    """The torch SDPA kernels a ``model.attention_backend`` value allows. ``auto`` is
    every kernel but cuDNN's: its fused attention backward crashed a FLUX-width
    learner on an H100 (torch 2.11, cuDNN 9.19: ``mha_graph.execute`` failing, later
    ``CUBLAS_STATUS_EXECUTION_FAILED``); on CPU it changes nothing."""
    from torch.nn.attention import SDPBackend as B

    table = {
        "auto": [B.FLASH_ATTENTION, B.EFFICIENT_ATTENTION, B.MATH],
        "flash": [B.FLASH_ATTENTION],
        "efficient": [B.EFFICIENT_ATTENTION],
        "cudnn": [B.CUDNN_ATTENTION],
        "math": [B.MATH],
    }
    if name not in table:
        raise ValueError(f"model.attention_backend must be one of {sorted(table)}, got {name!r}")
    return table[name]


def backend_failure(name: str, exc: BaseException) -> AttentionBackendError:
    kernels = ", ".join(b.name for b in sdpa_backends(name))
    return AttentionBackendError(
        f"transformer failed with model.attention_backend={name} (SDPA kernels: {kernels}): "
        f"{exc}. If this is about attention, choose another model.attention_backend "
        "(auto, flash, efficient, math)"
    )


def checkpointing_func(attention_backend: str, input_dtype: torch.dtype | None = None):
    """diffusers' ``gradient_checkpointing_func`` whose backward recomputes a block as
    its forward ran it. diffusers' default re-runs the block outside two things the
    forward had (both failed the learner's first update on an H200, torch 2.11: "Recomputed
    values ... have different metadata"):

    - the ``sdpa_kernel`` choice of ``model.attention_backend``: a context the backward
      has left, so the recompute may take another kernel that saves other tensors
      (reproduced on CPU: math in the forward, the CPU flash kernel in the recompute);
    - FSDP2's cast of a block's inputs to its ``param_dtype``, which torch 2.11 skips
      while the block's FSDP state is in its backward (2.13 casts there too): the
      recompute saw float32 where the forward saw bfloat16. ``input_dtype`` (the
      policy's ``param_dtype``) casts them before the checkpoint, so both passes get
      the cast the forward would have made anyway."""
    from torch.nn.attention import sdpa_kernel
    from torch.utils._pytree import tree_map
    from torch.utils.checkpoint import checkpoint

    kernels = sdpa_backends(attention_backend)

    def cast(x):
        if input_dtype is not None and isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.to(input_dtype)
        return x

    def in_kernels(block, *args):
        with sdpa_kernel(kernels):
            return block(*args)

    def run(block, *args):
        return checkpoint(in_kernels, block, *tree_map(cast, args), use_reentrant=False)

    return run


def compute_dtype(transformer: Any, autocast_dtype: torch.dtype | None) -> torch.dtype | None:
    """The dtype a velocity adapter's call computes in: ``autocast_dtype``, else the
    weights' own when they are not float32 (None: plain float32)."""
    if autocast_dtype is not None:
        return autocast_dtype
    param_dtype = next(transformer.parameters()).dtype
    return None if param_dtype == torch.float32 else param_dtype


@contextmanager
def transformer_call(device: torch.device, compute: torch.dtype | None, attention_backend: str):
    """Every family's transformer call: autocast to ``compute`` (off for None), the
    SDPA kernels ``model.attention_backend`` allows, and errors naming that backend."""
    from torch.nn.attention import sdpa_kernel

    with (
        # no weight cache: it would hold a low-precision copy of every weight for the
        # whole forward, defeating gradient checkpointing (the copies a backward
        # needs are saved by autograd either way)
        torch.autocast(
            device.type,
            dtype=compute or torch.float32,
            enabled=compute is not None,
            cache_enabled=False,
        ),
        sdpa_kernel(sdpa_backends(attention_backend)),
        naming_backend(attention_backend),
    ):
        yield


@contextmanager
def naming_backend(name: str):
    """Re-raise a RuntimeError from inside the block naming the attention backend."""
    try:
        yield
    except AttentionBackendError:
        raise
    except RuntimeError as exc:
        if _collective_failure(exc):  # a learner group's peer, not attention
            raise
        raise backend_failure(name, exc) from exc


def _collective_failure(exc: RuntimeError) -> bool:
    import torch.distributed as dist

    text = str(exc)
    return isinstance(exc, dist.DistError) or "Gloo" in text or "NCCL" in text
