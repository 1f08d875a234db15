"""``g2rpo bench precision``: does a precision setting change the log-probs the PPO
ratio compares? For each setting a rollout worker and a learner are built from the
same pipeline exactly as training builds them (``RolloutWorkerCore``,
``LearnerCore``); the worker loads the learner's published weights, rolls out a
G²RPO tree, and the learner recomputes the log-prob of every recorded SDE step
before any update. The ratio exp(new - old) is then 1 up to the arithmetic the two
sides do differently; with a ratio clip of 1e-4, a setting whose |ratio - 1| reaches
a good fraction of it clips samples for no reason.

Settings: float32; model.dtype bfloat16 under autocast on both sides (float32
weights, today's default for bf16); the workers holding bfloat16 weights
(``model.rollout_weights_dtype``); and the learner computing through FSDP2's
mixed-precision policy (``model.mixed_precision: fsdp``), on a one-rank group."""

from __future__ import annotations

from typing import Any

import torch

from ..common.errors import UsageError
from ..learner.ratio_check import ratio_before_update

SETTINGS = {
    "float32": [],
    "bf16_autocast": ["model.dtype=bfloat16"],
    "bf16_rollout_weights": ["model.dtype=bfloat16", "model.rollout_weights_dtype=bfloat16"],
    "bf16_fsdp_learner": ["model.dtype=bfloat16", "model.mixed_precision=fsdp"],
    "bf16_rollout_weights_fsdp_learner": [
        "model.dtype=bfloat16",
        "model.rollout_weights_dtype=bfloat16",
        "model.mixed_precision=fsdp",
    ],
}


def _ratio_of(cfg, prompts: list[str]) -> tuple[torch.Tensor, int]:
    from ..common.wire.weights import state_nbytes
    from ..learner.trainer import learner_outside_ray
    from ..rollout_worker.worker import RolloutWorkerCore

    with learner_outside_ray(cfg) as learner:  # the learner's real path: a one-rank group
        worker = RolloutWorkerCore(cfg, 0)
        version, state, checksum = learner.weights()
        worker.load_weights(version, state, checksum)
        _, cond, result, _ = worker.sample(0, prompts)
        return ratio_before_update(learner, result.transitions, cond), state_nbytes(state)


def bench_precision(
    config: str | None,
    overrides: list[str] | None = None,
    *,
    settings: list[str] | None = None,
    prompts: int = 8,
    device: str | None = None,
) -> dict[str, Any]:
    """Every setting on ``config`` (+ ``overrides``): the ratio statistics of one
    rollout of ``prompts`` train prompts."""
    from ..common.cluster.one_node import device_overrides
    from ..common.config.loading import load_config
    from ..common.prompts.prompts import read_prompts

    settings = settings or list(SETTINGS)
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise UsageError(f"settings {unknown}: choose from {sorted(SETTINGS)}")
    if prompts < 1:
        raise UsageError(f"prompts must be >= 1, got {prompts}")
    base = [*(overrides or []), f"sampling.prompts_per_worker={prompts}"]
    base = device_overrides(config, base, device)
    cfg = load_config(config, base)
    chosen = read_prompts(cfg.train.prompts, "train.prompts")[:prompts]
    if len(chosen) < prompts:
        raise UsageError(f"prompts={prompts}, but train.prompts holds {len(chosen)}")
    clip = cfg.optim.clip_range
    out: dict[str, Any] = {
        "settings": {
            "config": str(config),
            "prompts": prompts,
            "device": cfg.model.device,
            "clip_range": clip,
        }
    }
    for name in settings:
        ratio, nbytes = _ratio_of(load_config(config, [*base, *SETTINGS[name]]), chosen)
        dev = (ratio - 1).abs()
        out["settings"]["transitions"] = int(ratio.numel())
        out[name] = {
            "overrides": SETTINGS[name],
            "published_bytes": nbytes,
            "max_abs_ratio_minus_1": float(dev.max()),
            "mean_abs_ratio_minus_1": float(dev.mean()),
            "p99_abs_ratio_minus_1": float(dev.quantile(0.99)),
            "clipped_at_first_step": float((dev > clip).double().mean()),
            "max_over_clip": float(dev.max() / clip),
        }
    return out
