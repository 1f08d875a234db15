"""``g2rpo export``: a run's checkpoint (``healthy``: the one train.guard kept for the
last healthy evaluation; ``latest``; an iteration) as the diffusers layouts ``final/``
holds: ``pytorch_lora_weights.safetensors`` for a LoRA run, ``transformer/`` otherwise."""

from __future__ import annotations

from pathlib import Path

from ..common.errors import UsageError


def export_checkpoint(run: str | Path, which: str, out: str | Path) -> Path:
    from ..common.families.lora import save_lora_weights
    from ..common.families.registry import family_class
    from .policy import load_policy, resolve_policy

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out}: not empty (choose a new directory)")
    if which == "healthy" and _healthy_is_the_base(Path(run)):
        return _export_base(Path(run), out)
    source = resolve_policy(run, checkpoint=which)
    if source.kind != "checkpoint":
        raise UsageError(f"--checkpoint {which}: the run's {source.kind} is already exported")
    comps = load_policy(source)
    cfg = source.config
    out.mkdir(parents=True, exist_ok=True)
    if cfg.model.lora:
        family = family_class(cfg)
        return Path(save_lora_weights(comps.transformer, out, family.pipeline_class()))
    comps.transformer.save_pretrained(out / "transformer")
    return out / "transformer"


def _healthy_is_the_base(run: Path) -> bool:
    """train.guard found only the run's first evaluation healthy (the base model's
    weights, before any checkpoint)."""
    from ..run_directory.healthy import read_healthy

    known = read_healthy(run)
    return bool(known) and known["iteration"] == 0 and known.get("checkpoint") is None


def _export_base(run: Path, out: Path) -> Path:
    from ..common.config.loading import load_config
    from ..common.families.registry import components_class, config_family
    from ..common.paths import resolve_path

    cfg = load_config(run / "config.yaml")
    print(
        f"{run}: the last healthy evaluation is the first (iteration 0): the base model's "
        f"weights, {cfg.model.pretrained}, are exported"
    )
    transformer_class = components_class(config_family(cfg)).transformer_class()
    base = resolve_path(cfg.model.pretrained)
    model = transformer_class.from_pretrained(base, subfolder="transformer", local_files_only=True)
    model.save_pretrained(out / "transformer")
    return out / "transformer"
