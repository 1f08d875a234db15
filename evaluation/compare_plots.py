"""A comparison's pictures: held-out reward vs training NFEs and vs wall time
(mean over seeds, band = range over seeds), and the methods' samples side by side."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..run_directory.files import read_evaluations, read_metrics
from ..run_directory.grids import labelled_grid
from .compare_spec import CompareSpec, PlannedRun


def eval_curve(run_dir: Path, metric: str) -> dict[str, np.ndarray]:
    """A run's training-time evaluations: metric vs training NFEs and wall seconds
    spent before the evaluated weights."""
    rows = read_metrics(run_dir)
    wall = np.concatenate([[0.0], np.cumsum([r["time/iteration_s"] for r in rows])])
    points = []
    for ev in read_evaluations(run_dir):
        if metric in ev["scores"]:
            it = min(ev["iteration"], len(rows))
            points.append((ev["nfe_train_total"], wall[it], float(np.mean(ev["scores"][metric]))))
    arr = np.array(points, dtype=np.float64).reshape(-1, 3)
    return {"nfe": arr[:, 0], "wall": arr[:, 1], "value": arr[:, 2]}


def seed_band(curves: list[dict], axis: str, points: int = 60):
    """Curves on a common x grid (up to the shortest run): x, mean, min, max."""
    end = min(c[axis][-1] for c in curves)
    x = np.linspace(0.0, end, points)
    ys = np.stack([np.interp(x, c[axis], c["value"]) for c in curves])
    return x, ys.mean(0), ys.min(0), ys.max(0)


def draw_curves(spec: CompareSpec, runs: list[PlannedRun], metrics: list[str], out: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = {}
    for axis, xlabel in (("nfe", "training NFEs"), ("wall", "wall time of the iterations (s)")):
        fig, axes = plt.subplots(
            1, len(metrics), figsize=(6 * len(metrics), 4.2), constrained_layout=True, squeeze=False
        )
        for ax, metric in zip(axes[0], metrics, strict=True):
            for method in spec.methods:
                curves = [
                    c
                    for r in runs
                    if r.method == method
                    for c in [eval_curve(r.run_dir, metric)]
                    if len(c["value"]) >= 2
                ]
                if not curves:
                    continue
                x, mean, lo, hi = seed_band(curves, axis)
                line = ax.plot(x, mean, label=f"{spec.label(method)} ({len(curves)} seeds)")[0]
                ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.18)
            ax.set(xlabel=xlabel, ylabel=f"held-out {metric}", title=f"{metric} (band: seed range)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        paths[axis] = out / f"reward_vs_{axis}.png"
        fig.savefig(paths[axis], dpi=90)
        plt.close(fig)
    return paths


def draw_side_by_side(spec: CompareSpec, runs: list[PlannedRun], out: Path) -> Path | None:
    """Held-out (or the evaluated split's) prompts × (truth, base, each method's first
    seed), fixed noise."""
    from .eval_outputs import truth_tiles

    base = out / "base" / "tiles.npz"
    if not base.is_file():
        return None
    data = np.load(base)
    prompts = [str(p) for p in data["prompts"]]
    groups = []
    truth = truth_tiles(prompts)
    if truth is not None:
        groups.append(("truth", truth))
    groups.append(("base", data["tiles"]))
    for method in spec.methods:
        mine = sorted((r for r in runs if r.method == method), key=lambda r: r.seed)
        tiles = mine[0].run_dir / "eval" / "budget" / "tiles.npz" if mine else None
        if tiles is not None and tiles.is_file():
            groups.append((f"{spec.label(method)} (seed {mine[0].seed})", np.load(tiles)["tiles"]))
    title = side_by_side_title(data, spec.eval.splits)
    return labelled_grid(out / "grid.png", prompts, groups, title=title)


def side_by_side_title(tiles, splits: list[str]) -> str:
    """The grid's title names the split its tiles (a loaded tiles.npz) came from; tiles
    saved before the split was recorded are held-out ones, unless the spec left it out."""
    held = "held_out" if "held_out" in splits else splits[0]
    split = str(tiles["split"]) if "split" in tiles.files else held
    return f"{split.replace('_', '-')} prompts, the same noise in every group"
