"""``g2rpo bench engine``: the batched tree engine against the official-order
reference loop on one random FLUX-layout transformer, same seeds, one process."""

from __future__ import annotations

import platform
import time
from typing import Any

import torch

from ..common.errors import UsageError
from ..common.flops import count_flops, peak_tflops, utilisation
from ..common.flux import (
    FluxVelocity,
    build_tiny_flux,
    count_parameters,
    random_text_cond,
    tiny_flux_config,
)
from ..common.schedules import expected_g2rpo_nfe, sampling_grid
from ..rollout_worker.engine import RolloutEngine, RolloutResult, draw_noise
from ..rollout_worker.plan import g2rpo_plan


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(engine, plan, cond, init, sde, mode, device) -> tuple[RolloutResult, float]:
    _sync(device)
    start = time.perf_counter()
    result = engine.run(plan, cond, init, sde, mode)
    _sync(device)
    return result, time.perf_counter() - start


def raw_forward(model, cond, tokens, channels, nfe, calls, dev, gen, repeats: int = 3) -> dict:
    """The ceiling: the bare transformer forward at the engine's mean batch (its NFEs
    per model call), as many calls as the engine made; FLOPs per NFE counted on it."""
    batch = max(1, round(nfe / calls))
    x = torch.randn(batch, tokens, channels, generator=gen).to(dev)
    t = torch.full((batch,), 0.5, device=dev)
    c = {k: v[:1].expand(batch, *v.shape[1:]) for k, v in cond.items()}
    with torch.no_grad():
        flops = count_flops(lambda: model(x, t, c)) / batch
        model(x, t, c)  # warm-up at this shape
        best = float("inf")
        for _ in range(repeats):
            _sync(dev)
            start = time.perf_counter()
            for _ in range(calls):
                model(x, t, c)
            _sync(dev)
            best = min(best, time.perf_counter() - start)
    nfe_per_s = batch * calls / best
    return {
        "flops_per_nfe": int(flops),
        "batch": batch,
        "calls": calls,
        "wall_s": round(best, 4),
        "nfe_per_s": round(nfe_per_s, 2),
        **utilisation(flops * batch * calls, best, peak_tflops(dev)),
    }


def bench_engine(
    *,
    quick: bool = True,
    device: str = "cpu",
    size: str | None = None,
    dtype: str | None = None,
    latent_size: int | None = None,
    num_steps: int = 16,
    group_size: int = 12,
    sde_steps: list[int] | None = None,
    granularities: list[int] | None = None,
    terminal: str = "exact",
    num_prompts: int | None = None,
    max_batch: int = 256,
    repeats: int | None = None,
    seed: int = 0,
    progress: bool = False,
    attention_backend: str = "auto",
) -> dict[str, Any]:
    """Run both execution modes and return the comparison as a JSON-able dict."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda asked for, but torch sees no CUDA device")
    size = size or ("gpu" if dev.type == "cuda" else "bench")
    dtype = dtype or ("bfloat16" if dev.type == "cuda" else "float32")
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    sde_steps = list(range(8)) if sde_steps is None else sde_steps
    granularities = [1, 2] if granularities is None else granularities
    num_prompts = num_prompts or (1 if quick else 2)
    # 16 image tokens on CPU (the tiny world's size); 1024 (a 512² FLUX image) on GPU.
    latent_size = latent_size or (64 if dev.type == "cuda" else 8)
    if latent_size < 2 or latent_size % 2:
        raise UsageError(f"--latent-size must be an even number >= 2, got {latent_size}")
    repeats = repeats or (1 if quick else 3)
    # the tree's own checks first, before a model is built
    try:  # named as the options they came from
        plan = g2rpo_plan(
            num_prompts, num_steps, group_size, sde_steps, granularities, terminal=terminal
        )
    except ValueError as exc:
        raise UsageError(f"--steps/--group-size/--sde-steps/--granularities: {exc}") from None

    transformer = build_tiny_flux(size, seed=seed, dtype=torch_dtype).to(dev)
    model = FluxVelocity(transformer, latent_size, latent_size, attention_backend=attention_backend)
    cfg = tiny_flux_config(size)
    tokens = (latent_size // 2) ** 2
    gen = torch.Generator().manual_seed(seed)
    cond = {k: v.to(dev) for k, v in random_text_cond(cfg, num_prompts, gen).items()}
    init, sde = draw_noise(plan, (tokens, cfg["in_channels"]), gen)
    init, sde = init.to(dev), sde.to(dev)
    engine = RolloutEngine(
        model, sampling_grid(num_steps, 3.0), max_batch=max_batch, progress=progress
    )

    # Warm up both paths (allocator, kernels) on a one-prompt, one-step plan.
    warm = g2rpo_plan(1, num_steps, 2, sde_steps[:1], granularities[:1], terminal=terminal)
    w_init, w_sde = draw_noise(warm, (tokens, cfg["in_channels"]), gen)
    w_cond = {k: c[:1] for k, c in cond.items()}
    for mode in ("batched", "reference"):
        engine.run(warm, w_cond, w_init.to(dev), w_sde.to(dev), mode)

    batched_times, reference_times = [], []
    for _ in range(repeats):
        batched, tb = _timed(engine, plan, cond, init, sde, "batched", dev)
        reference, tr = _timed(engine, plan, cond, init, sde, "reference", dev)
        batched_times.append(tb)
        reference_times.append(tr)
    wall_b, wall_r = min(batched_times), min(reference_times)
    ceiling = raw_forward(
        model, cond, tokens, cfg["in_channels"], batched.nfe, batched.model_calls, dev, gen
    )
    peak = peak_tflops(dev)
    engine_flops = ceiling["flops_per_nfe"] * batched.nfe

    latent_diff = (batched.leaf_latents - reference.leaf_latents).abs().max().item()
    lp_diff = (
        (batched.transitions.old_log_probs - reference.transitions.old_log_probs).abs().max().item()
    )
    return {
        "parity_max_abs": max(latent_diff, lp_diff),
        "parity_latent_max_abs": latent_diff,
        "parity_log_prob_max_abs": lp_diff,
        "nfe_batched": batched.nfe,
        "nfe_expected": expected_g2rpo_nfe(
            num_steps, group_size, sde_steps, granularities, terminal, num_prompts
        ),
        "nfe_unshared": expected_g2rpo_nfe(
            num_steps,
            group_size,
            sde_steps,
            granularities,
            terminal,
            num_prompts,
            share_granularity_prefix=False,
        ),
        "nfe_reference": reference.nfe,
        "model_calls_batched": batched.model_calls,
        "model_calls_reference": reference.model_calls,
        "wall_batched_s": round(wall_b, 4),
        "wall_reference_s": round(wall_r, 4),
        "speedup": round(wall_r / wall_b, 3),
        "flops_per_nfe": ceiling["flops_per_nfe"],
        "engine": {
            "nfe_per_s": round(batched.nfe / wall_b, 2),
            **utilisation(engine_flops, wall_b, peak),
        },
        "raw_forward": {k: v for k, v in ceiling.items() if k != "flops_per_nfe"},
        "engine_vs_raw_forward": round(batched.nfe / wall_b / ceiling["nfe_per_s"], 4),
        "bf16_peak_tflops": peak,
        "settings": {
            "algorithm": "g2rpo",
            "num_steps": num_steps,
            "group_size": group_size,
            "sde_steps": sde_steps,
            "granularities": granularities,
            "terminal": terminal,
            "num_prompts": num_prompts,
            "shift": 3.0,
            "eta": plan.eta,
            "max_batch": max_batch,
            "repeats": repeats,
            "seed": seed,
            "quick": quick,
            "device": str(dev),
            "device_name": torch.cuda.get_device_name(dev)
            if dev.type == "cuda"
            else platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "model": {
                "class": "FluxTransformer2DModel",
                "preset": size,
                "parameters": count_parameters(transformer),
                "image_tokens": tokens,
                "token_channels": cfg["in_channels"],
                "text_tokens": 8,
                "dtype": dtype,
                "attention_backend": attention_backend,
            },
        },
    }
