"""The learner's optimizer: AdamW over the trained parameters, with its kernels chosen by
``optim.implementation``. The kernel changes only rounding and memory: torch's foreach
kernel (its default on CUDA) computes the step's denominator √v̂ + ε for every parameter
at once, a float32 scratch as large as the trained weights, which on a full fine-tune is
the learner's peak (measured on an H200: docs/benchmarks.md, "The third GPU run"); the
fused kernel updates in place and needs none."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..common.config.algorithm import OptimConfig


def adamw_kernel(optim: OptimConfig, device: str) -> str:
    """The kernel ``optim.implementation`` picks on ``device`` (auto: fused on CUDA,
    the per-parameter loop, torch's CPU default, on any other device)."""
    if optim.implementation != "auto":
        return optim.implementation
    return "fused" if torch.device(device).type == "cuda" else "for_loop"


def adamw(params: Iterable[torch.nn.Parameter], optim: OptimConfig, device: str):
    kernel = adamw_kernel(optim, device)
    return torch.optim.AdamW(
        params,
        lr=optim.lr,
        betas=optim.betas,
        eps=optim.eps,
        weight_decay=optim.weight_decay,
        fused=kernel == "fused",
        foreach=kernel == "foreach",
    )


def keep_kernel(optimizer: torch.optim.Optimizer, optim: OptimConfig, device: str) -> None:
    """After ``load_state_dict``: a checkpoint's param groups carry the kernel flags of
    the optimizer that saved it (torch's defaults before ``optim.implementation``, or
    another device's); the kernel is the config's, so set it back."""
    kernel = adamw_kernel(optim, device)
    for group in optimizer.param_groups:
        group["fused"] = kernel == "fused"
        group["foreach"] = kernel == "foreach"
