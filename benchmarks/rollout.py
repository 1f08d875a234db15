"""``g2rpo bench engine``: the batched tree engine against the official-order
reference loop on one random FLUX-layout transformer, same seeds, one process; with
``--compile``, the same engine again on the same transformer with its repeated blocks
compiled (``model.compile``), against the eager run."""

from __future__ import annotations

import platform
import time
from typing import Any

import torch

from ..common.algorithms.flops import count_flops, peak_tflops, utilisation
from ..common.algorithms.schedules import expected_g2rpo_nfe, sampling_grid
from ..common.errors import UsageError
from ..common.families.flux import (
    FluxVelocity,
    build_tiny_flux,
    count_parameters,
    random_text_cond,
    tiny_flux_config,
)
from ..common.families.transformer_compile import COMPILE_MODES, graphs_compiled
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
    compile: str = "none",
    blocks: tuple[int, int] | None = None,
    text_tokens: int = 8,
    engine_only: bool = False,
) -> dict[str, Any]:
    """Run both execution modes and return the comparison as a JSON-able dict.
    ``attention_backend`` fastest: measured as a rollout worker measures it
    (``model.rollout_attention_backend``). ``compile``: also the batched engine with the
    transformer's blocks compiled (``model.compile``). ``blocks``: (double, single) block
    counts instead of the preset's (FLUX.1-dev: 19, 38). ``engine_only``: the batched
    engine alone, without the reference loop and the bare-forward ceiling (FLOPs counted
    on one sample's forward), so FLUX.1-dev's depth fits a GPU stage."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda asked for, but torch sees no CUDA device")
    if compile not in COMPILE_MODES:
        raise UsageError(f"--compile must be one of {list(COMPILE_MODES)}, got {compile!r}")
    if compile == "blocks_cuda_graphs" and dev.type != "cuda":
        raise UsageError(
            f"--compile blocks_cuda_graphs: CUDA graphs exist on CUDA devices only, not on "
            f"{dev}: use --compile blocks"
        )
    if text_tokens < 1:
        raise UsageError(f"--text-tokens must be at least 1, got {text_tokens}")
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

    transformer, cfg = _transformer(size, blocks, seed, torch_dtype, dev)
    named = "auto" if attention_backend == "fastest" else attention_backend
    model = FluxVelocity(transformer, latent_size, latent_size, attention_backend=named)
    model.for_rollout(attention="fastest" if attention_backend == "fastest" else "same")
    tokens = (latent_size // 2) ** 2
    gen = torch.Generator().manual_seed(seed)
    cond = random_text_cond(cfg, num_prompts, gen, text_tokens=text_tokens)
    cond = {k: v.to(dev) for k, v in cond.items()}
    init, sde = draw_noise(plan, (tokens, cfg["in_channels"]), gen)
    init, sde = init.to(dev), sde.to(dev)
    engine = RolloutEngine(
        model, sampling_grid(num_steps, 3.0), max_batch=max_batch, progress=progress
    )

    # Warm up both paths (allocator, kernels) on a one-prompt, one-step plan.
    warm = g2rpo_plan(1, num_steps, 2, sde_steps[:1], granularities[:1], terminal=terminal)
    w_init, w_sde = draw_noise(warm, (tokens, cfg["in_channels"]), gen)
    w_cond = {k: c[:1] for k, c in cond.items()}
    modes = ("batched",) if engine_only else ("batched", "reference")
    for mode in modes:
        engine.run(warm, w_cond, w_init.to(dev), w_sde.to(dev), mode)

    batched_times, reference_times = [], []
    for _ in range(repeats):
        batched, tb = _timed(engine, plan, cond, init, sde, "batched", dev)
        batched_times.append(tb)
        if not engine_only:
            reference, tr = _timed(engine, plan, cond, init, sde, "reference", dev)
            reference_times.append(tr)
    wall_b = min(batched_times)
    peak = peak_tflops(dev)
    if engine_only:
        ceiling, reference = None, None
        flops_per_nfe = _flops_per_nfe(model, cond, init)
    else:
        ceiling = raw_forward(
            model, cond, tokens, cfg["in_channels"], batched.nfe, batched.model_calls, dev, gen
        )
        flops_per_nfe = ceiling.pop("flops_per_nfe")
    engine_flops = flops_per_nfe * batched.nfe
    compiled = None
    if compile != "none":  # last: it compiles this very transformer's blocks in place
        compiled = compiled_engine(
            engine,
            plan,
            cond,
            init,
            sde,
            dev,
            compile,
            repeats,
            (batched, wall_b),
            engine_flops,
            peak,
        )
    return {
        **_reference_fields(batched, reference, reference_times, wall_b, ceiling),
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
        "flops_per_nfe": flops_per_nfe,
        "engine": {
            "wall_s": round(wall_b, 4),
            "nfe_per_s": round(batched.nfe / wall_b, 2),
            **utilisation(engine_flops, wall_b, peak),
        },
        "compiled": compiled,
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
            "engine_only": engine_only,
            "device": str(dev),
            "device_name": torch.cuda.get_device_name(dev)
            if dev.type == "cuda"
            else platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "model": {
                "class": "FluxTransformer2DModel",
                "preset": size,
                "double_blocks": cfg["num_layers"],
                "single_blocks": cfg["num_single_layers"],
                "parameters": count_parameters(transformer),
                "image_tokens": tokens,
                "token_channels": cfg["in_channels"],
                "text_tokens": text_tokens,
                "dtype": dtype,
                **model.attention_record(),
                "attention_asked": attention_backend,
            },
        },
    }


def _transformer(size, blocks, seed, dtype, dev):
    """The preset's random transformer (built as ever), or with ``blocks`` (double,
    single) instead of its depth: built on ``dev`` in ``dtype`` directly (FLUX.1-dev's
    12B parameters would take minutes to initialise on a CPU, and 48 GB in float32)."""
    cfg = tiny_flux_config(size)
    if blocks is None:
        return build_tiny_flux(size, seed=seed, dtype=dtype).to(dev), cfg
    from diffusers import FluxTransformer2DModel

    cfg.update(num_layers=blocks[0], num_single_layers=blocks[1])
    default = torch.get_default_dtype()
    torch.manual_seed(seed)
    torch.set_default_dtype(dtype)
    try:
        with torch.device(dev):
            model = FluxTransformer2DModel(**cfg)
    finally:
        torch.set_default_dtype(default)
    return model.eval(), cfg  # built in dtype: no cast


def _flops_per_nfe(model, cond, init) -> int:
    """FLOPs of one sample's forward (torch's flop counter), eager."""
    c = {k: v[:1] for k, v in cond.items()}
    t = torch.full((1,), 0.5, device=init.device)
    with torch.inference_mode():
        return count_flops(lambda: model(init[:1], t, c))


def compiled_engine(engine, plan, cond, init, sde, dev, mode, repeats, eager, flops, peak):
    """The batched engine again with the transformer's blocks compiled (``mode``): the
    first run's seconds (the compile paid in it), the steady runs' best, and how far its
    leaves and log-probs are from the eager run's. CUDA graphs record a batch size at
    its second call: two runs before the timed ones. ``eager``: (its result, seconds)."""
    eager, eager_s = eager
    model = engine.model
    model.for_rollout(mode)
    before = graphs_compiled()
    first, first_s = _timed(engine, plan, cond, init, sde, "batched", dev)
    if mode == "blocks_cuda_graphs":
        _timed(engine, plan, cond, init, sde, "batched", dev)
    graphs = graphs_compiled() - before
    times = []
    for _ in range(repeats):
        result, seconds = _timed(engine, plan, cond, init, sde, "batched", dev)
        times.append(seconds)
    wall = min(times)
    latent = (result.leaf_latents - eager.leaf_latents).abs().max().item()
    log_prob = (result.transitions.old_log_probs - eager.transitions.old_log_probs).abs().max()
    return {
        "compile": mode,
        "first_run_s": round(first_s, 4),
        "wall_s": round(wall, 4),
        "graphs_compiled": graphs,
        "recompiled_after_first_run": graphs_compiled() - before - graphs,
        "nfe_per_s": round(result.nfe / wall, 2),
        **utilisation(flops, wall, peak),
        "speedup_vs_eager": round(eager_s / wall, 3),
        "parity_latent_max_abs": latent,
        "parity_log_prob_max_abs": log_prob.item(),
        "first_run_equals_steady": bool(torch.equal(first.leaf_latents, result.leaf_latents)),
    }


def _reference_fields(batched, reference, reference_times, wall_b, ceiling) -> dict:
    """The comparison with the official-order loop and the bare-forward ceiling (None
    where ``engine_only`` skipped them)."""
    fields: dict[str, Any] = {
        "nfe_batched": batched.nfe,
        "model_calls_batched": batched.model_calls,
        "wall_batched_s": round(wall_b, 4),
    }
    if reference is None:
        return {
            "parity_max_abs": None,
            **fields,
            "nfe_reference": None,
            "wall_reference_s": None,
            "speedup": None,
            "raw_forward": None,
            "engine_vs_raw_forward": None,
        }
    wall_r = min(reference_times)
    latent_diff = (batched.leaf_latents - reference.leaf_latents).abs().max().item()
    lp_diff = (
        (batched.transitions.old_log_probs - reference.transitions.old_log_probs).abs().max().item()
    )
    return {
        "parity_max_abs": max(latent_diff, lp_diff),
        "parity_latent_max_abs": latent_diff,
        "parity_log_prob_max_abs": lp_diff,
        **fields,
        "nfe_reference": reference.nfe,
        "model_calls_reference": reference.model_calls,
        "wall_reference_s": round(wall_r, 4),
        "speedup": round(wall_r / wall_b, 3),
        "raw_forward": ceiling,
        "engine_vs_raw_forward": round(batched.nfe / wall_b / ceiling["nfe_per_s"], 4),
    }


def format_engine_only(result: dict) -> str:
    """``bench engine --engine-only``'s human output."""
    e, m = result["engine"], result["settings"]["model"]
    mfu = f", MFU {e['mfu']:.1%}" if e["mfu"] else ""
    text = (
        f"batched engine, {m['double_blocks']}+{m['single_blocks']} blocks, "
        f"{m['parameters']:,} params: {e['wall_s']:.3f} s for {result['nfe_batched']} NFEs, "
        f"{e['nfe_per_s']:.2f} NFE/s, {e['tflops']:.3f} TFLOP/s{mfu}"
    )
    if result["compiled"] is not None:
        text += "\n" + format_compiled(result["compiled"])
    return text


def format_compiled(c: dict) -> str:
    """The compiled engine's line of ``bench engine --compile``."""
    mfu = f", MFU {c['mfu']:.1%}" if c["mfu"] else ""
    return (
        f"  compiled ({c['compile']}): first run {c['first_run_s']:.2f} s "
        f"({c['graphs_compiled']} graphs), then {c['wall_s']:.3f} s, {c['nfe_per_s']:.2f} NFE/s"
        f"{mfu}: {c['speedup_vs_eager']:.2f}x the eager engine, leaves within "
        f"{c['parity_latent_max_abs']:.1e}, log-probs within {c['parity_log_prob_max_abs']:.1e}"
    )
