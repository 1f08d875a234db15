"""A run's curves from its metrics.jsonl rows: one panel function per picture
(rewards, PPO ratio and clipping, advantages, loss and grad norm, seconds per phase),
composed into ``runs/<name>/curves.png`` (redrawn at checkpoints, at most once a minute,
and at the last) and drawn one by one in the HTML report."""

from __future__ import annotations

from pathlib import Path

PHASES = ("weight_push", "eval", "rollout", "reward", "learn")


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["iteration"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def draw_rewards(ax, rows: list[dict], granularities: bool = False) -> None:
    """Rollout rewards per reward model (and granularity), anchors, held-out eval."""
    keys = sorted(k for k in rows[0] if k.startswith(("reward/", "anchor_reward/")))
    if not granularities:
        keys = [k for k in keys if k.count("/") == 1]
    keys += sorted({k for r in rows for k in r if k.startswith("eval/") and k.count("/") == 1})
    for key in keys:
        style = "o-" if key.startswith("eval/") else ":" if key.startswith("anchor") else "-"
        if key.count("/") == 2:
            style = "--"
        ax.plot(*_series(rows, key), style, ms=3, lw=1.2, label=key)
    ax.set(title="rewards (eval: held-out, fixed noise)", xlabel="iteration")
    ax.legend(fontsize=7, ncol=2)


def draw_ratio(ax, rows: list[dict]) -> None:
    for key in ("ratio_min", "ratio_mean", "ratio_max"):
        ax.plot(*_series(rows, key), label=key)
    ax.set(title="PPO ratio and clip fraction", xlabel="iteration")
    twin = ax.twinx()
    twin.plot(*_series(rows, "clip_fraction"), "k--", label="clip_fraction")
    twin.set_ylim(0, 1)
    ax.legend(fontsize=7, loc="upper left")
    twin.legend(fontsize=7, loc="upper right")


def draw_advantages(ax, rows: list[dict]) -> None:
    for key in ("adv_abs_mean", "adv_std"):
        ax.plot(*_series(rows, key), label=key)
    ax.set(title="advantages", xlabel="iteration", ylabel="advantage")
    twin = ax.twinx()
    twin.plot(*_series(rows, "adv_clipped_frac"), "r:", label="adv_clipped_frac")
    zero = _series(rows, "adv_zero_frac")
    if zero[0]:  # runs from before the metric have none
        twin.plot(*zero, "k--", label="adv_zero_frac (all-equal groups)")
    twin.set_ylim(0, 1)
    ax.legend(fontsize=7, loc="upper left")
    twin.legend(fontsize=7, loc="upper right")


def draw_loss(ax, rows: list[dict]) -> None:
    ax.plot(*_series(rows, "loss"), label="loss")
    ax.set(title="loss and grad norm (before clipping)", xlabel="iteration")
    twin = ax.twinx()
    twin.plot(*_series(rows, "grad_norm"), "g-", label="grad_norm")
    ax.legend(fontsize=7, loc="upper left")
    twin.legend(fontsize=7, loc="upper right")


def draw_time(ax, rows: list[dict]) -> None:
    """Seconds per iteration by phase on the critical path (eval: the wait for it)."""
    x = [r["iteration"] for r in rows]
    bottom = [0.0] * len(rows)
    for phase in PHASES:
        height = [float(r.get(f"time/{phase}_s", 0.0)) for r in rows]
        ax.bar(x, height, bottom=bottom, label=phase, width=0.9)
        bottom = [b + h for b, h in zip(bottom, height, strict=True)]
    ax.set(title="seconds per iteration, by phase", xlabel="iteration")
    ax.legend(fontsize=7)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on cluster nodes
    import matplotlib.pyplot as plt

    return plt


def plot_curves(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Draw the curves of ``rows`` (metrics.jsonl objects) into ``path``."""
    if not rows:
        raise ValueError("no metrics rows to plot")
    plt = pyplot()
    # fixed margins: constrained layout looked the same at this size and cost 0.3 s of
    # the 0.75 s a draw took (each run draws it at least once)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    fig.subplots_adjust(left=0.06, right=0.94, bottom=0.08, top=0.91, wspace=0.28, hspace=0.32)
    draw_rewards(axes[0][0], rows)
    draw_ratio(axes[0][1], rows)
    draw_loss(axes[1][0], rows)
    draw_time(axes[1][1], rows)
    if title:
        fig.suptitle(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
