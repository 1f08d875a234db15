"""The run's curves as one PNG (``runs/<name>/curves.png``), redrawn at every
checkpoint from metrics.jsonl rows: rewards (rollout and held-out evaluation, per
reward model), the PPO ratio range and clip fraction, loss and grad norm, and the
wall time of each phase."""

from __future__ import annotations

from pathlib import Path

PHASES = ("weight_push", "eval", "rollout", "reward", "learn")


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["iteration"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_curves(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Draw the curves of ``rows`` (metrics.jsonl objects) into ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on cluster nodes
    import matplotlib.pyplot as plt

    if not rows:
        raise ValueError("no metrics rows to plot")
    rewards = sorted(
        k.split("/", 1)[1] for k in rows[0] if k.count("/") == 1 and k.startswith("reward/")
    )
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), constrained_layout=True)
    ax = axes[0][0]
    for name in rewards:
        for prefix, style in (("reward", "-"), ("anchor_reward", ":"), ("eval", "o-")):
            x, y = _series(rows, f"{prefix}/{name}")
            if x:
                ax.plot(x, y, style, ms=3, label=f"{prefix}/{name}")
    ax.set(title="rewards (eval: held-out anchors)", xlabel="iteration")
    ax.legend(fontsize=7)

    ax = axes[0][1]
    for key in ("ratio_min", "ratio_mean", "ratio_max"):
        ax.plot(*_series(rows, key), label=key)
    ax.set(title="PPO ratio", xlabel="iteration")
    twin = ax.twinx()
    twin.plot(*_series(rows, "clip_fraction"), "k--", label="clip_fraction")
    twin.set_ylim(0, 1)
    ax.legend(fontsize=7, loc="upper left")
    twin.legend(fontsize=7, loc="upper right")

    ax = axes[1][0]
    ax.plot(*_series(rows, "loss"), label="loss")
    ax.set(title="loss and grad norm", xlabel="iteration")
    twin = ax.twinx()
    twin.plot(*_series(rows, "grad_norm"), "g-", label="grad_norm")
    ax.legend(fontsize=7, loc="upper left")
    twin.legend(fontsize=7, loc="upper right")

    ax = axes[1][1]
    x = [r["iteration"] for r in rows]
    bottom = [0.0] * len(rows)
    for phase in PHASES:
        height = [float(r.get(f"time/{phase}_s", 0.0)) for r in rows]
        ax.bar(x, height, bottom=bottom, label=phase, width=0.9)
        bottom = [b + h for b, h in zip(bottom, height, strict=True)]
    ax.set(title="seconds per iteration", xlabel="iteration")
    ax.legend(fontsize=7)

    if title:
        fig.suptitle(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
