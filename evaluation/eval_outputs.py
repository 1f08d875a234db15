"""What ``g2rpo eval`` writes: ``eval.json`` (settings, sources, per-split means with
95% CIs and paired differences against the base, per-prompt values), ``eval.md``
(the same as a table) and ``grid.png`` (truth | base | model, labelled)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..common.algorithms.stats import per_prompt_means
from ..common.health import image_health
from ..common.health.embedding_diversity import NAME as DIVERSITY_EMBED
from ..common.health.embedding_diversity import embedding_diversity
from ..common.prompts.shapes import parse_prompt, render_batch
from ..run_directory.grids import labelled_grid, spread_rows
from .evaluate import EvalSettings, SplitSamples
from .metrics import paired, summarise


def health_values(samples: SplitSamples, base: SplitSamples | None) -> dict[str, np.ndarray]:
    """Every sample's image-health measures (common/health/image_health.py), those against the
    base on the base's sample of the same noise (without a base: against itself, 0), and
    ``diversity_embed`` where the samples have embeddings and two or more per prompt."""
    base_thumbs = None if base is None else base.thumbnails
    out = {
        **samples.image_measures,
        **image_health.against_base(samples.thumbnails, base_thumbs, samples.per_prompt),
    }
    if samples.embeddings is not None and samples.per_prompt >= 2:
        out[DIVERSITY_EMBED] = embedding_diversity(samples.embeddings, samples.per_prompt)
    return out


def split_summary(samples: SplitSamples, base: SplitSamples | None = None, seed: int = 0) -> dict:
    """Means with CIs per metric, and (with a base) the paired differences; the same
    for the image-health measures under ``health``."""
    n_prompts = len(samples.prompts)
    out = {
        "prompts": n_prompts,
        "samples": len(samples.images),
        "metrics": {k: v.as_dict() for k, v in summarise(samples.values, n_prompts, seed).items()},
        "per_prompt": {
            k: per_prompt_means(v, n_prompts).round(6).tolist() for k, v in samples.values.items()
        },
    }
    if base is not None:
        if base.prompts != samples.prompts or base.per_prompt != samples.per_prompt:
            raise ValueError(f"split {samples.split}: base and model were sampled differently")
        diffs = paired(samples.values, base.values, n_prompts, seed)
        out["vs_base"] = {k: v.as_dict() for k, v in diffs.items()}
    health = health_values(samples, base)
    out["health"] = {
        "metrics": {k: v.as_dict() for k, v in summarise(health, n_prompts, seed).items()}
    }
    if samples.embedding_scorer is not None:  # whose features diversity_embed reads
        out["health"]["embedding_scorer"] = samples.embedding_scorer
    if base is not None:
        own = health_values(base, None)
        diffs = paired(health, own, n_prompts, seed)
        out["health"]["vs_base"] = {k: v.as_dict() for k, v in diffs.items()}
    return out


def eval_summary(
    model: dict[str, SplitSamples],
    base: dict[str, SplitSamples] | None,
    settings: EvalSettings,
    sources: dict,
) -> dict:
    return {
        "settings": settings.model_dump(mode="json"),
        **sources,
        "splits": {
            split: split_summary(s, base[split] if base else None) for split, s in model.items()
        },
    }


def _fmt(iv: dict, signed: bool = False) -> str:
    f = "{:+.4f}" if signed else "{:.4f}"
    return f"{f.format(iv['mean'])} [{f.format(iv['lo'])}, {f.format(iv['hi'])}]"


def markdown_table(summary: dict, base_summary: dict | None = None) -> str:
    """One row per (split, metric): base, model, paired difference (95% CIs)."""
    has_base = any("vs_base" in s for s in summary["splits"].values())
    head = "| split | metric | model [95% CI] |"
    rule = "|---|---|---|"
    if has_base:
        head += " base [95% CI] | model − base (paired) [95% CI] |"
        rule += "---|---|"
    lines = [head, rule]
    for split, s in summary["splits"].items():
        base_split = (base_summary or {}).get("splits", {}).get(split, {})
        tables = [(s["metrics"], s.get("vs_base", {}), base_split.get("metrics", {}), "")]
        if "health" in s:
            h, bh = s["health"], base_split.get("health", {})
            tables.append((h["metrics"], h.get("vs_base", {}), bh.get("metrics", {}), "health/"))
        for metrics, vs_base, b, prefix in tables:
            for metric, iv in metrics.items():
                lines.append(
                    _table_row(
                        split, prefix + metric, iv, has_base, b.get(metric), vs_base.get(metric)
                    )
                )
    return "\n".join(lines) + "\n"


def _table_row(split, metric, iv, has_base, base_iv, diff) -> str:
    row = f"| {split} | {metric} | {_fmt(iv)} |"
    if has_base:
        row += f" {_fmt(base_iv) if base_iv else '—'} |"
        row += f" {_fmt(diff, signed=True) if diff else '—'} |"
    return row


def truth_tiles(prompts: list[str], seed: int = 7) -> np.ndarray | None:
    """[len(prompts), 1, H, W, 3] ground-truth renders, or None for prompts that are
    not shapes-world prompts."""
    try:
        specs = [parse_prompt(p) for p in prompts]
    except ValueError:
        return None
    return render_batch(specs, seed=seed)[:, None]


def write_eval_grid(
    path: str | Path,
    model: SplitSamples,
    base: SplitSamples | None,
    *,
    model_label: str,
    base_label: str = "base",
    rows: int = 10,
    per_group: int = 4,
) -> Path:
    picked = spread_rows(len(model.prompts), rows)
    k = min(per_group, model.per_prompt)
    groups = []
    truth = truth_tiles([model.prompts[r] for r in picked])
    if truth is not None:
        groups.append(("truth", truth))
    if base is not None:
        groups.append((base_label, base.tiles(picked, k)))
    groups.append((model_label, model.tiles(picked, k)))
    return labelled_grid(
        path,
        [model.prompts[r] for r in picked],
        groups,
        title=f"{model.split} prompts, fixed noise: the same noise in every column group",
    )


def write_eval_outputs(
    out: str | Path,
    summary: dict,
    model: dict[str, SplitSamples],
    base: dict[str, SplitSamples] | None,
    base_summary: dict | None,
    model_label: str,
) -> dict[str, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "eval.json", "markdown": out / "eval.md", "grid": out / "grid.png"}
    paths["json"].write_text(json.dumps(summary, indent=1) + "\n")
    paths["markdown"].write_text(markdown_table(summary, base_summary))
    split = "held_out" if "held_out" in model else next(iter(model))
    write_eval_grid(
        paths["grid"],
        model[split],
        base[split] if base else None,
        model_label=model_label,
    )
    return paths
