"""Which config field a failed ``g2rpo doctor`` phase points at: one its error names
(when it is a real field of the config), else the memory fields of an out-of-memory,
else the phase's own."""

from __future__ import annotations

import re

import torch
from pydantic import BaseModel

from ..common.config.run import G2RPOConfig

# the field to look at when a phase fails (an out-of-memory names the memory fields)
PHASE_FIELDS = {
    "plan": "train.memory.gpu_memory_gib",
    "rollout worker": "model.pretrained",
    "learner": "model.pretrained",
    "publish": "model.rollout_weights_dtype",
    "rollout": "sampling.max_batch",
    "score": "train.reward.scorers",
    "precision": "model.dtype",
    "learn": "train.learner.max_batch",
    "evaluate": "train.eval.samples",
}
OOM_FIELDS = {
    "rollout worker": "model.rollout_weights_dtype",
    "precision": "train.learner.max_batch",
    "learner": "train.learner.count / model.lora / model.mixed_precision",
    "rollout": "sampling.max_batch / sampling.decode_batch",
    "learn": "train.learner.max_batch / model.gradient_checkpointing",
    "evaluate": "sampling.max_batch / sampling.decode_batch",
}


FIELD_IN_MESSAGE = re.compile(
    r"\b(?:model|sampling|algorithm|optim|rewards|run|train)\.[a-z_.]*[a-z_]"
)


def is_config_field(path: str) -> bool:
    """``train.reward.scorers`` is a field of G2RPOConfig; ``model.safetensors`` is not."""
    model: type[BaseModel] | None = G2RPOConfig
    for part in path.split("."):
        if model is None or part not in model.model_fields:
            return False
        annotation = model.model_fields[part].annotation
        inner = [a for a in getattr(annotation, "__args__", ()) if isinstance(a, type)]
        kinds = [annotation, *inner]
        model = next((k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)), None)
    return True


def field_of(phase: str, exc: BaseException) -> str:
    """The config field a failure points at: one the message names, else the
    memory fields of an out-of-memory, else the phase's own."""
    for named in FIELD_IN_MESSAGE.finditer(str(exc)):
        if is_config_field(named.group(0)):
            return named.group(0)
    if _is_oom(exc) and phase in OOM_FIELDS:
        return OOM_FIELDS[phase]
    return PHASE_FIELDS.get(phase, "")


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()
