"""Measuring the shapes world: the base model's analytic-checker pass rate on held-out
prompts, how well ``shapes_clip`` separates correct from mismatched pairs (AUC), and
a labelled sample grid."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..common.algorithms.schedules import sampling_grid
from ..common.families.registry import PipelineComponents, load_components, pipeline_sampling_grid
from ..common.prompts.shapes import ShapeSpec, render_batch, split_combinations
from ..reward_server.scorers.clip_score import ClipScore
from ..reward_server.scorers.shapes_oracle import ShapesOracle
from ..rollout_worker.plan import anchor_plan
from ..rollout_worker.worker import sample_on_pipeline
from .text import MAX_TOKENS

IMAGE_SIZE = 32


def world_grid(comps: PipelineComponents, num_steps: int, shift: float, size: int):
    """The σ grid a world is sampled on: its family's (``SAMPLING``: the shifted grid,
    or for Qwen-Image the pipeline's own, shifted by the image's size, with σ itself as
    the timestep), as ``g2rpo eval`` samples a bare pipeline."""
    if comps.path is None:
        return sampling_grid(num_steps, shift)
    family = type(comps).SAMPLING  # the components class is the family's
    kind, quantize = family.get("sigma_grid", "uniform"), family.get("quantize_timestep", True)
    return pipeline_sampling_grid(comps.path, num_steps, shift, quantize, kind, size)


def sample_images(
    comps: PipelineComponents,
    prompts: list[str],
    seed: int,
    num_steps: int = 16,
    shift: float = 3.0,
    size: int = IMAGE_SIZE,
    max_sequence_length: int = MAX_TOKENS,
) -> np.ndarray:
    """Deterministic ODE samples (the policy's evaluation samples) as uint8 [N, H, W, 3]."""
    _, _, images = sample_on_pipeline(
        comps,
        comps.velocity_model(size, size),
        world_grid(comps, num_steps, shift, size),
        anchor_plan(len(prompts), num_steps),
        prompts,
        torch.Generator().manual_seed(seed),
        size=size,
        max_sequence_length=max_sequence_length,
    )
    return images.numpy()


def auc(positive: np.ndarray, negative: np.ndarray) -> float:
    """P(score of a correct pair > score of a mismatched pair), ties counting ½."""
    pos, neg = np.asarray(positive)[:, None], np.asarray(negative)[None, :]
    return float((pos > neg).mean() + 0.5 * (pos == neg).mean())


def _rates(checks) -> dict[str, float]:
    return {
        "bg": float(np.mean([c.bg_ok for c in checks])),
        "fg": float(np.mean([c.fg_ok for c in checks])),
        "shape": float(np.mean([c.shape_ok for c in checks])),
        "pass": float(np.mean([c.passed for c in checks])),
    }


def evaluate_world(
    world_dir: str | Path,
    *,
    samples_per_prompt: int = 5,
    seed: int = 0,
    grid_path: str | Path | None = None,
) -> dict:
    world = Path(world_dir)
    comps = load_components(world / "pipeline")  # any family's world
    clip = ClipScore(world / "shapes_clip", name="shapes_clip")
    oracle = ShapesOracle()
    train, held = split_combinations()
    rng = np.random.default_rng(seed)
    train_eval = [train[i] for i in rng.choice(len(train), len(held), replace=False)]
    report: dict = {"samples_per_prompt": samples_per_prompt, "seed": seed}
    samples = {}
    for split, specs in (("held_out", held), ("train", train_eval)):
        prompts = [s.prompt for s in specs for _ in range(samples_per_prompt)]
        imgs = sample_images(comps, prompts, seed=seed)
        samples[split] = (specs, imgs)
        report[split] = {
            "prompts": len(specs),
            "samples": len(prompts),
            "checker": _rates(oracle.checks(imgs, prompts)),
            "shapes_clip_mean": float(clip.score(imgs, prompts).mean()),
        }
    # shapes_clip on ground truth: correct vs mismatched prompts (held-out combinations)
    truth = [s for s in held for _ in range(samples_per_prompt)]
    gt = render_batch(truth, seed=seed + 1)
    wrong = [
        held[(held.index(s) + 1 + int(rng.integers(len(held) - 1))) % len(held)] for s in truth
    ]
    pos = clip.score(gt, [s.prompt for s in truth])
    neg = clip.score(gt, [s.prompt for s in wrong])
    report["shapes_clip_auc"] = auc(pos, neg)
    report["shapes_clip_gt_mean"] = float(pos.mean())
    report["shapes_clip_mismatched_mean"] = float(neg.mean())
    if grid_path is not None:
        specs, imgs = samples["held_out"]
        rows = list(range(0, len(specs), max(1, len(specs) // 10)))[:10]  # varied prompts
        picked = np.concatenate(
            [imgs[r * samples_per_prompt : (r + 1) * samples_per_prompt] for r in rows]
        )
        write_grid(grid_path, [specs[r] for r in rows], picked, samples_per_prompt, seed)
        report["grid"] = str(grid_path)
    return report


def write_grid(
    path: str | Path,
    specs: list[ShapeSpec],
    images: np.ndarray,
    per_prompt: int,
    seed: int,
    scale: int = 4,
) -> None:
    """One row per prompt: its label, a ground-truth render, then the model's samples."""
    from PIL import Image, ImageDraw

    cell = IMAGE_SIZE * scale + 4
    label_w = 230
    grid = Image.new("RGB", (label_w + cell * (per_prompt + 1), cell * len(specs) + 20), "white")
    draw = ImageDraw.Draw(grid)
    draw.text((label_w, 4), "truth | samples (held-out prompts, ODE, 16 steps)", fill="black")
    truth = render_batch(specs, seed=seed + 7)
    for row, spec in enumerate(specs):
        y = 20 + row * cell
        draw.text((6, y + cell // 2 - 6), spec.prompt, fill="black")
        tiles = [truth[row]] + [images[row * per_prompt + j] for j in range(per_prompt)]
        for col, tile in enumerate(tiles):
            big = Image.fromarray(tile).resize((IMAGE_SIZE * scale,) * 2, Image.NEAREST)
            grid.paste(big, (label_w + col * cell + (6 if col else 0), y))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    grid.save(path)
