"""``g2rpo bench replay``: the one-gather replay against the per-step replay under
``optim.step_mode: accumulate``, on a real FSDP2 learner group (gloo ranks on the CPU,
no Ray) over a random FLUX-layout transformer: per iteration and rank, the policy's
forward calls, FSDP2's all-gathers and reduce-scatters (counted as they dispatch), the
best wall time of an update; and how far the two replays' first updates (from the same
weights, on the same rollout) differ in loss, gradient and PPO ratio."""

from __future__ import annotations

import collections
import copy
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from ..common.families.flux import FluxVelocity, build_tiny_flux, count_parameters, tiny_flux_config
from ..learner.distributed import (
    RankShare,
    fsdp_modules,
    gather_objects,
    join_learner_group,
    leave_learner_group,
    shard_transformer,
)
from ..learner.grpo import grpo_update
from .learner import random_rollout

REPLAYS = ("per_step", "stacked")
# the collectives FSDP2 issues (torch.distributed's all_gather_into_tensor and
# reduce_scatter_tensor); the statistics' all_gather_object and the gradient norm's
# all_reduce dispatch under other names
_GATHER, _REDUCE_SCATTER = "_allgather_base_", "_reduce_scatter_base_"


class Collectives(TorchDispatchMode):
    """Every collective dispatched inside, by op name."""

    def __init__(self) -> None:
        super().__init__()
        self.count: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if any(part in name for part in ("gather", "reduce", "scatter", "broadcast")):
            self.count[name] += 1
        return func(*args, **(kwargs or {}))


class RecordingAdamW(torch.optim.AdamW):
    """AdamW that keeps this rank's shard of the gradient it was handed at its first
    step (the gradient the replays must agree on)."""

    def __init__(self, params, **kw) -> None:
        super().__init__(params, **kw)
        self.first: list[torch.Tensor] | None = None

    def step(self, closure=None):
        if self.first is None:
            grads = [p.grad for p in self.param_groups[0]["params"]]
            self.first = [getattr(g, "to_local", lambda g=g: g)().detach().clone() for g in grads]
        return super().step(closure)


def _sharded_velocity(base, latent: int, trainable: bool) -> FluxVelocity:
    transformer = copy.deepcopy(base).train(trainable).requires_grad_(trainable)
    shard_transformer(transformer, "cpu", None)
    return FluxVelocity(transformer, latent, latent)


def _rank(rank: int, port: int, settings: dict, results) -> None:
    """One learner rank: the same rollout as every rank (rank 0's, broadcast), then per
    replay a fresh sharded copy of the same weights, one counted update and timed ones."""
    s = settings
    torch.set_num_threads(s["threads"])
    world = s["world"]
    join_learner_group(f"127.0.0.1:{port}", rank, world, "cpu", s["timeout_s"])
    try:
        config = tiny_flux_config(s["preset"])
        base = build_tiny_flux(s["preset"], seed=s["seed"])
        rollout = [None]
        if rank == 0:
            gen = torch.Generator().manual_seed(s["seed"])
            sampler = FluxVelocity(base, s["latent_size"], s["latent_size"])
            rollout = [
                random_rollout(
                    sampler,
                    config,
                    torch.device("cpu"),
                    num_prompts=s["num_prompts"],
                    num_steps=s["num_steps"],
                    group_size=s["group_size"],
                    sde_steps=s["sde_steps"],
                    latent=s["latent_size"],
                    gen=gen,
                )
            ]
        dist.broadcast_object_list(rollout, src=0)
        transitions, advantages, cond, spec = rollout[0]
        share = RankShare(rank, world, sharded=True)
        reference = _sharded_velocity(base, s["latent_size"], False) if s["kl_beta"] else None
        out: dict[str, Any] = {}
        grads = {}
        for replay in REPLAYS:
            velocity = _sharded_velocity(base, s["latent_size"], True)
            params = [p for p in velocity.transformer.parameters() if p.requires_grad]
            optimizer = RecordingAdamW(params, lr=1e-6, weight_decay=0.0)
            calls = collections.Counter()
            velocity.transformer.register_forward_pre_hook(
                lambda *_, calls=calls: calls.update(["forward"])
            )

            def update(velocity=velocity, params=params, optimizer=optimizer, replay=replay):
                return grpo_update(
                    velocity,
                    params,
                    optimizer,
                    transitions,
                    advantages,
                    cond,
                    spec,
                    clip_range=1e-4,
                    max_grad_norm=1e9,  # the gradients compared as computed
                    step_mode="accumulate",
                    max_batch=s["max_batch"],
                    reference_model=reference,
                    kl_beta=s["kl_beta"],
                    share=share,
                    replay=replay,
                )

            with Collectives() as seen:
                stats = update()  # the first update: counted, and the weights' first step
            grads[replay], forwards_seen = optimizer.first, calls["forward"]
            best = float("inf")
            for _ in range(s["repeats"]):
                dist.barrier()
                start = time.perf_counter()
                update()
                dist.barrier()
                best = min(best, time.perf_counter() - start)
            out[replay] = {
                "learner_calls": stats.learner_calls,
                "forward_calls_seen": forwards_seen,  # by a hook on the transformer
                "all_gathers": seen.count[_GATHER],
                "reduce_scatters": seen.count[_REDUCE_SCATTER],
                "seconds_per_update": best,
                "loss": stats.loss,
                "ratio_max_abs_dev": max(abs(stats.ratio_max - 1), abs(stats.ratio_min - 1)),
                "forward_samples": stats.nfe_learn,
                "optimizer_steps": stats.optimizer_steps,
            }
        diff = max(float((a - b).abs().max()) for a, b in zip(*grads.values(), strict=True))
        scale = max(float(g.abs().max()) for g in grads["per_step"])
        parts = gather_objects((out, diff, scale))
        if rank == 0:
            results.put(
                {
                    "ranks": [p[0] for p in parts],
                    "grad_max_abs_diff": max(p[1] for p in parts),
                    "grad_max_abs": max(p[2] for p in parts),
                    "states": int(transitions.states.shape[0]),
                    "transitions": len(transitions),
                    "parameters": count_parameters(base),
                    "blocks": len(fsdp_modules(base)) - 1,
                }
            )
    finally:
        leave_learner_group()


def bench_replay(
    *,
    preset: str = "bench",
    world: int = 2,
    num_prompts: int = 4,
    num_steps: int = 16,
    group_size: int = 4,
    sde_steps: list[int] | None = None,
    max_batch: int = 64,
    latent_size: int = 8,
    kl_beta: float = 0.0,
    repeats: int = 3,
    threads: int = 1,
    seed: int = 0,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Both replays under ``accumulate`` on ``world`` gloo ranks of one FSDP2 group:
    counts per rank and iteration (every rank runs as many forwards), the best of
    ``repeats`` timed updates (rank 0's clock between barriers), and the two first
    updates' differences."""
    import torch.multiprocessing as mp

    from ..common.cluster.net import free_port

    if world < 1 or max_batch < 1 or repeats < 1:
        raise ValueError("--world, --max-batch and --repeats must be >= 1")
    settings = {
        "preset": preset,
        "world": world,
        "num_prompts": num_prompts,
        "num_steps": num_steps,
        "group_size": group_size,
        "sde_steps": sde_steps or list(range(8)),
        "max_batch": max_batch,
        "latent_size": latent_size,
        "kl_beta": kl_beta,
        "repeats": repeats,
        "threads": threads,
        "seed": seed,
        "timeout_s": timeout_s,
    }
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.spawn(_rank, args=(free_port(), settings, results), nprocs=world, join=True)
    found = results.get()
    rank0 = found["ranks"][0]
    per, one = rank0["per_step"], rank0["stacked"]
    blocks = found["blocks"]
    return {
        "settings": {
            **settings,
            "parameters": found["parameters"],
            "blocks": blocks,
            "fsdp_units": blocks + 1,
            "states": found["states"],
            "transitions": found["transitions"],
            "torch": torch.__version__,
        },
        "per_rank": {r: p for r, p in enumerate(found["ranks"])},
        "per_step": per,
        "stacked": one,
        "loss_abs_diff": abs(per["loss"] - one["loss"]),
        "grad_max_abs_diff": found["grad_max_abs_diff"],
        "grad_max_abs": found["grad_max_abs"],
        "forward_calls_ratio": per["learner_calls"] / one["learner_calls"],
        "all_gathers_ratio": per["all_gathers"] / max(one["all_gathers"], 1),
        "wall_ratio": per["seconds_per_update"] / one["seconds_per_update"],
    }


def format_replay(r: dict[str, Any]) -> str:
    s = r["settings"]
    lines = [
        f"accumulate, {s['world']} FSDP2 rank(s) on the CPU (gloo), random FLUX-layout "
        f"'{s['preset']}' ({s['parameters']:,} params, {s['blocks']} blocks), "
        f"{s['states']} states / {s['transitions']} transitions "
        f"(prompts {s['num_prompts']}, k {s['sde_steps']}, G {s['group_size']}), "
        f"max_batch {s['max_batch']}, kl_beta {s['kl_beta']:g}",
        "per rank and iteration:   forward calls  all-gathers  reduce-scatters  s/update",
    ]
    for name in REPLAYS:
        p = r[name]
        lines.append(
            f"  {name:<22} {p['learner_calls']:>13}  {p['all_gathers']:>11}  "
            f"{p['reduce_scatters']:>15}  {p['seconds_per_update']:>8.4f}"
        )
    lines.append(
        f"per-step / stacked: {r['forward_calls_ratio']:.2f}x forwards, "
        f"{r['all_gathers_ratio']:.2f}x all-gathers, {r['wall_ratio']:.2f}x wall time"
    )
    lines.append(
        f"first update: |Δloss| {r['loss_abs_diff']:.2e}, max |Δgrad| "
        f"{r['grad_max_abs_diff']:.2e} (max |grad| {r['grad_max_abs']:.2e}), "
        f"|ratio − 1| stacked {r['stacked']['ratio_max_abs_dev']:.2e}"
    )
    return "\n".join(lines)
