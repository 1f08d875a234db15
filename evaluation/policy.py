"""What ``g2rpo eval`` evaluates, loaded into a FLUX pipeline: a run directory (its
``final/`` export or any checkpoint), a diffusers pipeline directory, or a LoRA
export over a base pipeline. Every path is local; a wrong one is named."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..common.config.loading import load_config
from ..common.config.run import G2RPOConfig
from ..common.errors import RunDirError, UsageError
from ..common.families.loaders import ModelPathError
from ..common.families.lora import attach_lora
from ..common.families.registry import PipelineComponents, load_components
from ..common.paths import resolve_path

LORA_FILE = "pytorch_lora_weights.safetensors"


@dataclass
class PolicySource:
    """Where a policy's weights come from; ``label`` names it in tables and grids."""

    kind: str  # pipeline | run-final | checkpoint | lora
    base: Path  # the pipeline directory the weights go into
    weights: Path | None = None  # final/transformer, a checkpoint .pt or a LoRA file
    label: str = ""
    config: G2RPOConfig | None = None  # a run's own config
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "label": self.label,
            "base": str(self.base),
            "weights": str(self.weights) if self.weights else None,
            **self.details,
        }


def _is_pipeline(path: Path) -> bool:
    return (path / "model_index.json").is_file()


def _lora_file(path: Path) -> Path | None:
    if path.is_file() and path.name.endswith(".safetensors"):
        return path
    if (path / LORA_FILE).is_file():
        return path / LORA_FILE
    return None


def _run_checkpoint(run: Path, which: str) -> Path:
    """A checkpoint of either layout (``it_N.pt`` or a sharded ``it_N.dcp/``)."""
    from ..run_directory.files import list_checkpoints

    ckpts = list_checkpoints(run)
    if which == "healthy":
        return _healthy_checkpoint(run)
    if which == "latest":
        if not ckpts:
            raise ModelPathError(f"{run}: no checkpoints/it_* to evaluate")
        return ckpts[-1]
    if which.isdigit():
        which = f"it_{int(which):05d}"
    stem = which.removesuffix(".pt").removesuffix(".dcp")
    found = [p for p in ckpts if p.stem == stem]
    if not found:
        have = ", ".join(p.stem for p in ckpts) or "none"
        path = run / "checkpoints" / which
        raise ModelPathError(f"--checkpoint {which}: {path} does not exist (the run has: {have})")
    return found[0]


def _healthy_checkpoint(run: Path) -> Path:
    """The checkpoint ``healthy.json`` names: the newest at or before the run's last
    evaluation that train.guard found healthy."""
    from ..run_directory.healthy import kept_for_health, read_healthy

    known = read_healthy(run)
    if known is None:
        raise ModelPathError(
            f"--checkpoint healthy: {run}/healthy.json does not exist (train.guard was off, "
            "or no evaluation has been read yet)"
        )
    path = kept_for_health(run)
    if path is None:
        raise ModelPathError(
            f"--checkpoint healthy: the last healthy evaluation is iteration "
            f"{known['iteration']}, but no checkpoint at or before it is left "
            f"(healthy.json names {known.get('checkpoint')}); train.checkpoints.every sets "
            "how often there is one"
        )
    return path


def resolve_policy(
    target: str | Path, *, base: str | Path | None = None, checkpoint: str | None = None
) -> PolicySource:
    """Work out what ``target`` is. ``checkpoint``: for a run, ``final`` (default when
    it exists), ``latest``, ``healthy`` (train.guard's last healthy evaluation), an
    iteration number or a checkpoint name."""
    path = resolve_path(target)
    if not path.exists():
        raise ModelPathError(f"eval target {str(target)!r} does not exist")
    if (path / "config.yaml").is_file():  # a run directory
        cfg = load_config(path / "config.yaml")
        if cfg.model.pretrained is None:
            raise RunDirError(f"{path}: the run's model.pretrained is empty; nothing to load")
        run_base = resolve_path(cfg.model.pretrained)
        base_dir = resolve_path(base) if base else run_base
        which = checkpoint or ("final" if (path / "final").exists() else "latest")
        if which == "final":
            final = path / "final"
            weights = _lora_file(final) if cfg.model.lora else final / "transformer"
            if weights is None or not weights.exists():
                raise ModelPathError(f"{final}: no exported weights (is the run finished?)")
            kind = "run-final"
        else:
            weights, kind = _run_checkpoint(path, which), "checkpoint"
        return PolicySource(
            kind=kind,
            base=base_dir,
            weights=weights,
            label=f"{path.name}:{weights.stem if kind == 'checkpoint' else 'final'}",
            config=cfg,
            details={"run": str(path)},
        )
    if _is_pipeline(path):
        return PolicySource(kind="pipeline", base=path, label=path.name)
    lora = _lora_file(path)
    if lora is not None:
        if base is None:
            raise UsageError(f"{path} holds LoRA weights: pass --base PIPELINE_DIR to apply them")
        return PolicySource(kind="lora", base=resolve_path(base), weights=lora, label=path.name)
    raise ModelPathError(
        f"eval target {str(path)!r} is neither a run directory (config.yaml), a diffusers "
        f"pipeline directory (model_index.json) nor a LoRA export ({LORA_FILE})"
    )


def load_policy(source: PolicySource, device: str = "cpu") -> PipelineComponents:
    """The base pipeline (of its family) with the source's weights in its transformer."""
    comps = load_components(source.base, device=device)
    if source.weights is None:
        pass
    elif source.kind == "lora" or (source.kind == "run-final" and source.weights.is_file()):
        _apply_lora_export(comps, source.weights)
    elif source.kind == "run-final":
        comps.transformer = (
            type(comps)
            .transformer_class()
            .from_pretrained(source.weights, local_files_only=True)
            .to(device)
        )
    else:
        _load_checkpoint(comps, source.weights, source.config)
    return comps.for_inference()  # adapters or a reloaded transformer included


def _apply_lora_export(comps: PipelineComponents, weights: Path) -> None:
    """diffusers' own LoRA loader, on the family's pipeline assembled from the loaded parts."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(
        comps.path, subfolder="scheduler", local_files_only=True
    )
    pipe = comps.as_pipeline(scheduler)
    pipe.load_lora_weights(str(weights.parent), weight_name=weights.name)


def _load_checkpoint(comps: PipelineComponents, path: Path, cfg: G2RPOConfig | None) -> None:
    from ..learner.checkpoints import is_sharded_checkpoint, load_weights_into

    if is_sharded_checkpoint(path):  # a learner group's: its weights, resharded
        load_weights_into(comps.transformer, path)
        return
    state = torch.load(path, map_location="cpu", weights_only=False)
    if "lora" in state:
        from ..common.families.lora import load_adapter_state

        if cfg is None or cfg.model.lora is None:
            raise RunDirError(f"{path}: a LoRA checkpoint, but its run config has no model.lora")
        attach_lora(comps.transformer, cfg)
        load_adapter_state(comps.transformer, state["lora"])
    elif "transformer" in state:
        comps.transformer.load_state_dict(state["transformer"])
    else:
        raise RunDirError(f"{path}: not a g2rpo checkpoint (no 'transformer' or 'lora' entry)")
