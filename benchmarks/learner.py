"""``g2rpo bench learner`` (one GRPO update: log-prob recompute, PPO-clip, backward,
optimizer step; full and LoRA) and ``g2rpo bench weights`` (publish + verified load
of one version on N workers vs one object-store put+get of the same bytes). Random
FLUX-layout transformers, no download."""

from __future__ import annotations

import copy
import time
from typing import Any

import torch

from ..common.algorithms.flops import count_flops, peak_tflops, utilisation
from ..common.algorithms.schedules import sampling_grid
from ..common.config.algorithm import OptimConfig
from ..common.config.model import LoraOptions
from ..common.errors import UsageError
from ..common.families.flux import (
    FluxVelocity,
    build_tiny_flux,
    count_parameters,
    random_text_cond,
    tiny_flux_config,
)
from ..common.families.lora import add_lora
from ..learner.grpo import StepSpec, grpo_update
from ..learner.optimizer import adamw, adamw_kernel
from ..rollout_worker.engine import RolloutEngine, draw_noise
from ..rollout_worker.plan import g2rpo_plan


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def random_rollout(model, cfg, dev, *, num_prompts, num_steps, group_size, sde_steps, latent, gen):
    """A real G²RPO rollout of the random model (one trained state per prompt and SDE
    step, random advantages): the learner's input in the update benchmarks."""
    tokens = (latent // 2) ** 2
    cond = {k: v.to(dev) for k, v in random_text_cond(cfg, num_prompts, gen).items()}
    plan = g2rpo_plan(num_prompts, num_steps, group_size, sde_steps, [1])
    init, sde = draw_noise(plan, (tokens, cfg["in_channels"]), gen)
    grid = sampling_grid(num_steps, 3.0)
    result = RolloutEngine(model, grid, max_batch=256).run(plan, cond, init.to(dev), sde.to(dev))
    advantages = torch.randn(int(torch.tensor(plan.adv_shape).prod()), generator=gen)
    return result.transitions, advantages, cond, StepSpec(grid=grid, eta=0.7, sde_type="flow")


def bench_learner(
    *,
    device: str = "cpu",
    size: str | None = None,
    dtype: str | None = None,
    latent_size: int | None = None,
    num_prompts: int = 2,
    num_steps: int = 16,
    group_size: int = 4,
    sde_steps: list[int] | None = None,
    lora_rank: int = 16,
    repeats: int = 3,
    attention_backend: str = "auto",
    adamw_implementation: str = "auto",
    seed: int = 0,
) -> dict[str, Any]:
    """One GRPO update per repeat (the best time counts), full and LoRA, on the same
    transitions. FLOPs (forward + backward) are counted by torch's flop counter; on CUDA
    the allocator's peak of the timed updates is reported too."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda asked for, but torch sees no CUDA device")
    size = size or ("flux" if dev.type == "cuda" else "bench")
    dtype = dtype or ("bfloat16" if dev.type == "cuda" else "float32")
    autocast = None if dtype == "float32" else torch.bfloat16
    latent = latent_size or (64 if dev.type == "cuda" else 8)
    sde_steps = sde_steps or [0, 1, 2, 3]
    adamw_options = OptimConfig(lr=1e-6, implementation=adamw_implementation)
    gen = torch.Generator().manual_seed(seed)
    cfg = tiny_flux_config(size)
    base = build_tiny_flux(size, seed=seed).to(dev)  # fp32 master weights, as the learner
    sampler = FluxVelocity(base, latent, latent, autocast_dtype=autocast)
    transitions, advantages, cond, spec = random_rollout(
        sampler,
        cfg,
        dev,
        num_prompts=num_prompts,
        num_steps=num_steps,
        group_size=group_size,
        sde_steps=sde_steps,
        latent=latent,
        gen=gen,
    )
    peak = peak_tflops(dev)
    out: dict[str, Any] = {
        "settings": {
            "device": str(dev),
            "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "preset": size,
            "parameters": count_parameters(base),
            "image_tokens": (latent // 2) ** 2,
            "compute_dtype": dtype,
            "weights_dtype": "float32",
            "attention_backend": attention_backend,
            "num_prompts": num_prompts,
            "group_size": group_size,
            "sde_steps": sde_steps,
            "transitions": len(transitions),
            "step_mode": "per_sde_step",
            "repeats": repeats,
            "adamw_kernel": adamw_kernel(adamw_options, device),
        },
        "bf16_peak_tflops": peak,
    }
    for mode in ("full", "lora"):
        transformer = copy.deepcopy(base).train()
        if mode == "lora":
            add_lora(transformer, LoraOptions(rank=lora_rank, alpha=2.0 * lora_rank), seed)
        params = [p for p in transformer.parameters() if p.requires_grad]
        model = FluxVelocity(
            transformer,
            latent,
            latent,
            autocast_dtype=autocast,
            attention_backend=attention_backend,
        )
        optimizer = adamw(params, adamw_options, device)

        def update(model=model, params=params, optimizer=optimizer):
            return grpo_update(
                model,
                params,
                optimizer,
                transitions,
                advantages,
                cond,
                spec,
                clip_range=1e-4,
                max_grad_norm=1.0,
            )

        stats = update()  # warm-up (kernels, optimizer state)
        flops = count_flops(update)
        best = float("inf")
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        for _ in range(repeats):
            _sync(dev)
            start = time.perf_counter()
            update()
            _sync(dev)
            best = min(best, time.perf_counter() - start)
        out[mode] = {
            "trainable_parameters": sum(p.numel() for p in params),
            "seconds_per_update": round(best, 4),
            "forward_samples": stats.nfe_learn,
            "optimizer_steps": stats.optimizer_steps,
            "flops_per_update": flops,
            "peak_gib": (
                round(torch.cuda.max_memory_allocated(dev) / 2**30, 3)
                if dev.type == "cuda"
                else None
            ),
            **utilisation(flops, best, peak),
        }
        del transformer, model, optimizer
    out["lora_vs_full_time"] = round(
        out["lora"]["seconds_per_update"] / out["full"]["seconds_per_update"], 4
    )
    return out
