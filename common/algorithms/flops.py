"""FLOP counting (torch.utils.flop_counter), the bf16 peaks MFU is measured
against, and the best-of-N wall time the benchmarks report."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

# Dense bf16 tensor-core peaks, TFLOP/s (vendor datasheets; sparsity excluded).
BF16_PEAK_TFLOPS = {
    "H200": 989.4,
    "H100 SXM": 989.4,
    "H100 80GB HBM3": 989.4,
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H100": 989.4,
    "A100": 312.0,
    "L40S": 362.1,
    "L4": 121.0,
    "A10": 125.0,
}


def count_cpu_attention() -> None:
    """Teach torch's flop counter the CPU attention kernel. It counts the CUDA kernels
    (flash, memory-efficient, cuDNN) but not ``_scaled_dot_product_flash_attention_for_cpu``,
    which SDPA runs on a CPU and under fake tensors, so a CPU count left out every
    attention's matmuls (a twelfth of FLUX.1-dev's FLOPs at 720²). Same formula as flash."""
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    forward = aten._scaled_dot_product_flash_attention_for_cpu
    backward = aten._scaled_dot_product_flash_attention_for_cpu_backward
    pairs = ((forward, fc.sdpa_flop_count, False), (backward, fc.sdpa_backward_flop_count, True))
    for op, formula, backward in pairs:
        if op in fc.flop_registry:
            continue

        # the counter hands formulas shapes; the backward's are (grad_out, q, k, v, ...)
        def count(*shapes, out_shape=None, _formula=formula, _backward=backward, **kw) -> int:
            return _formula(*shapes[: 4 if _backward else 3])

        fc.register_flop_formula(op)(count)


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of one call of ``fn`` (forward and, if it runs one, backward)."""
    from torch.utils.flop_counter import FlopCounterMode

    count_cpu_attention()
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def peak_tflops(device: torch.device | str) -> float | None:
    """The device's dense bf16 peak, or None when unknown (CPUs, unlisted GPUs)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    name = torch.cuda.get_device_name(dev)
    for key, peak in BF16_PEAK_TFLOPS.items():  # most specific names first
        if key in name:
            return peak
    return None


def update_flops(
    flops_per_nfe: float,
    forwards: int,
    no_grad_forwards: int,
    checkpointing: bool,
    frozen_base: bool = False,
) -> float:
    """FLOPs of a learner update from its sample forwards. A forward with a backward
    costs a forward plus the backward's gradients: of the inputs (one forward's worth)
    and of the weights (another, unless the base is frozen, as under LoRA, whose
    adapters cost next to nothing), plus one more forward when gradient checkpointing
    recomputes it. A forward without a backward (an old or reference velocity) costs one."""
    trained = forwards - no_grad_forwards
    if trained < 0:
        raise ValueError(f"no_grad_forwards ({no_grad_forwards}) exceeds forwards ({forwards})")
    passes = 1 + 1 + (0 if frozen_base else 1) + (1 if checkpointing else 0)
    return flops_per_nfe * (trained * passes + no_grad_forwards)


def utilisation(flops: float, seconds: float, peak: float | None) -> dict:
    """Achieved TFLOP/s and, when the peak is known, MFU (fraction of it)."""
    tflops = flops / seconds / 1e12 if seconds > 0 else 0.0
    # significant digits, not decimals: a test-size model on a busy CPU runs at ~1e-5 TFLOP/s
    mfu = float(f"{tflops / peak:.4g}") if peak else None
    return {"tflops": float(f"{tflops:.4g}"), "mfu": mfu}


def best_seconds(
    fn: Callable[[], object], repeats: int, warmup: bool = False, clock=time.perf_counter
) -> float:
    """The fastest of ``repeats`` calls of ``fn`` (after one untimed call if ``warmup``),
    by ``clock`` (wall time; ``time.process_time`` for the CPU it costs, whatever else the
    machine runs)."""
    if warmup:
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return best
