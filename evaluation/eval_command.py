"""``g2rpo eval TARGET``: evaluate a run, a pipeline or a LoRA export against its
base on fixed noise and write eval.json, eval.md and grid.png."""

from __future__ import annotations

from pathlib import Path

from .eval_outputs import eval_summary, write_eval_outputs
from .evaluate import EvalSettings, evaluate_policy, pipeline_settings
from .metrics import make_scorers
from .policy import PolicySource, load_policy, resolve_policy


def default_out(source: PolicySource) -> Path:
    if "run" in source.details:
        return Path(source.details["run"]) / "eval" / source.label.split(":", 1)[1]
    return Path("evals") / source.label


def eval_command(
    target: str,
    *,
    base: str | None = None,
    no_base: bool = False,
    checkpoint: str | None = None,
    out: str | None = None,
    progress: bool = True,
    **overrides,
) -> tuple[dict, dict[str, Path]]:
    """Evaluate ``target`` (and its base unless ``no_base``); returns the summary and
    the written files. ``overrides``: EvalSettings fields (None = default)."""
    source = resolve_policy(target, base=base, checkpoint=checkpoint)
    if source.config is not None:
        settings = EvalSettings.for_run(source.config, **overrides)
    else:
        settings = pipeline_settings(source.base, **overrides)
    scorers = make_scorers(settings.scorers, settings.device)
    model = evaluate_policy(
        load_policy(source, settings.device), settings, scorers, progress=progress
    )
    base_source = None
    if not no_base and (source.kind != "pipeline" or base is not None):
        base_source = resolve_policy(source.base)
    base_samples = base_summary = None
    if base_source is not None:
        base_samples = evaluate_policy(
            load_policy(base_source, settings.device), settings, scorers, progress=progress
        )
        base_summary = eval_summary(base_samples, None, settings, {"model": base_source.as_dict()})
    sources = {"model": source.as_dict()}
    if base_source is not None:
        sources["base"] = base_source.as_dict()
    summary = eval_summary(model, base_samples, settings, sources)
    if base_summary is not None:
        summary["base_metrics"] = {s: v["metrics"] for s, v in base_summary["splits"].items()}
    paths = write_eval_outputs(
        out or default_out(source), summary, model, base_samples, base_summary, source.label
    )
    return summary, paths
