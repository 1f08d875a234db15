"""For an actor that does not fit: the cheapest config changes that make it fit, each
found by planning the changed config again (never guessed)."""

from __future__ import annotations

from dataclasses import dataclass

from ..common.config.loading import config_from_dict
from ..common.config.run import G2RPOConfig
from ..common.errors import ConfigError
from .estimate import plan

# each actor kind's GPU field (a CUDA config that gives one of them no GPU is refused
# when it loads, so a remedy never needs to add one)
GPU_FIELDS = {
    "rollout worker": "train.workers.num_gpus",
    "learner rank": "train.learner.num_gpus",
    "evaluator": "train.eval.num_gpus",
    "reward replica": "train.reward.num_gpus",
}


@dataclass
class Remedy:
    changes: list[str]  # a.b=c overrides
    peak: int  # the actor's new estimate, bytes


def _with(cfg: G2RPOConfig, changes: list[str]) -> G2RPOConfig | None:
    try:
        return config_from_dict(cfg.model_dump(mode="json"), changes)
    except ConfigError:
        return None  # not a legal combination (e.g. fsdp with LoRA)


def _actor(p, name: str):
    return next(a for a in p.actors if a.actor == name)


def _largest_fitting(cfg, name, field: str, current: int, extra: list[str], gib) -> list[str]:
    """``field=N`` for the largest power-of-two N below ``current`` that fits."""
    n = 1
    while n * 2 < current:
        n *= 2
    while n >= 1:
        changed = _with(cfg, [*extra, f"{field}={n}"])
        if changed is not None and _actor(plan(changed, gib), name).fits:
            return [*extra, f"{field}={n}"]
        n //= 2
    return []


def _base_changes(cfg: G2RPOConfig, name: str) -> tuple[list[list[str]], list[str]]:
    """(change sets to try, batch fields to shrink on top of one that is not enough)."""
    m, t = cfg.model, cfg.train
    if name == "learner rank":
        ckpt = [] if m.gradient_checkpointing else ["model.gradient_checkpointing=true"]
        mp = ["model.mixed_precision=fsdp"] if m.dtype == "bfloat16" and m.lora is None else []
        out = [[], ckpt, ["model.lora={rank: 64}", *ckpt]]
        for n in (2, 4, 8, 16, 32):
            if n > t.learner.count and m.lora is None:
                out += [
                    [f"train.learner.count={n}", *ckpt],
                    [f"train.learner.count={n}", *ckpt, *mp],
                ]
        return out, ["train.learner.max_batch"]
    if name in ("rollout worker", "evaluator"):
        bf16 = (
            ["model.rollout_weights_dtype=bfloat16"]
            if m.dtype == "bfloat16" and m.lora is None and m.rollout_weights_dtype != "bfloat16"
            else []
        )
        return [[], bf16], ["sampling.decode_batch", "sampling.max_batch"]
    return [], []


def _current(cfg: G2RPOConfig, field: str) -> int:
    value = cfg
    for part in field.split("."):
        value = getattr(value, part)
    return value


def remedies(cfg: G2RPOConfig, name: str, gpu_memory_gib: float | None = None, most: int = 3):
    """Up to ``most`` changes that make actor kind ``name`` fit, fewest changes first."""
    found: list[Remedy] = []
    bases, batch_fields = _base_changes(cfg, name)
    seen = set()
    for base in bases:
        changes = list(base)
        for field in [None, *batch_fields]:
            if field is not None:  # not enough: shrink a batch as well
                shrunk = _largest_fitting(
                    cfg, name, field, _current(cfg, field), changes, gpu_memory_gib
                )
                changes = shrunk or [*changes, f"{field}=1"]
            if not changes or tuple(changes) in seen:
                continue
            seen.add(tuple(changes))
            changed = _with(cfg, changes)
            if changed is None:
                break
            new = _actor(plan(changed, gpu_memory_gib), name)
            if new.fits:
                found.append(Remedy(changes, new.peak))
                break
    found.sort(key=lambda r: len(r.changes))
    return found[:most]
