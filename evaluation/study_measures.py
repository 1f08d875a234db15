"""The pre-registered hacking study's measures (docs/results/hacking/preregistration.md),
computed afterwards from each run's kept evaluation images (``train.eval.keep_images``) by
the code of this commit, and written as one gzipped JSON a run: what the study command
reads, committed in place of the images (about 8 MB a run).

Each evaluation is written as a record in ``evals/it_N.json``'s shape (``prompts``,
``per_prompt``, ``scores``, ``health``: per-sample values) so that the run's rows follow
from ``orchestration.records.evaluation_change`` exactly as the driver's do, and with its
images' sha256.

    g2rpo hacking measure RUN_DIR... --out MEASURES_DIR
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import numpy as np

EMBEDDING_SCORER = "shapes_clip"  # the tiny world's image embedding (diversity_embed)


def _images(path: Path) -> np.ndarray:
    return np.load(path)["images"]


def measure_evaluation(images, record, base_thumbs, embed) -> dict:
    """One evaluation as a record: its saved scores, and every health measure of every
    sample (against ``base_thumbs``, the run's first evaluation's thumbnails)."""
    from ..common.health import image_health
    from ..common.health.embedding_diversity import embedding_diversity

    per_prompt = record["per_prompt"]
    thumbs = image_health.thumbnails(images)
    health = image_health.per_image(images)
    health.update(image_health.against_base(thumbs, base_thumbs, per_prompt))
    health["diversity_embed"] = embedding_diversity(embed(images), per_prompt)
    return {
        "iteration": record["iteration"],
        "nfe_train_total": record.get("nfe_train_total"),
        "prompts": record["prompts"],
        "per_prompt": per_prompt,
        "scores": record["scores"],
        "health": {k: np.round(np.asarray(v, np.float64), 6).tolist() for k, v in health.items()},
    }


def measure_run(run: Path, embed) -> dict:
    """Every kept evaluation of ``run`` measured; ``embed(images) -> [N, D]``."""
    from ..common.config.loading import load_config
    from ..common.health import image_health
    from .study_sheets import kept_evaluations

    config = (run / "config.yaml").read_text()
    cfg = load_config(run / "config.yaml")
    out = {
        "run": run.name,
        "config_sha256": hashlib.sha256(config.encode()).hexdigest(),
        "trained": {r.name: r.weight for r in cfg.rewards},
        "budget_nfe": cfg.run.nfe_budget,
    }
    evaluations, base_thumbs = [], None
    for iteration, path in kept_evaluations(run):
        record = json.loads((run / "evals" / f"it_{iteration:05d}.json").read_text())
        images = _images(path)
        if base_thumbs is None:
            base_thumbs = image_health.thumbnails(images)
        entry = measure_evaluation(images, record, base_thumbs, embed)
        entry["images_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        evaluations.append(entry)
    out["evaluations"] = evaluations
    return out


def write_measures(runs: list[Path], out: Path, progress: bool = True) -> list[Path]:
    """``out/<run name>.json.gz`` for each run (named by its spec: ``<study>/<run>``)."""
    from tqdm.auto import tqdm

    from ..common.paths import resolve_path
    from .metrics import make_scorers

    spec = f"{EMBEDDING_SCORER}={resolve_path('assets/shapes-world/shapes_clip')}"
    embed = make_scorers([spec], "cpu")[EMBEDDING_SCORER].embed  # loaded once

    written = []
    for run in tqdm(runs, desc="measure runs", disable=not progress):
        data = measure_run(run, embed)
        study = run.parent.parent.name  # runs/compare/<study>/runs/<run>
        path = out / study / f"{run.name}.json.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            json.dump(data, f, separators=(",", ":"))
        written.append(path)
    return written


def read_measures(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)
