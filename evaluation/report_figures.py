"""The figures of a run's report, from its metrics.jsonl rows and evaluations, as
PNG bytes: rewards (per reward model and granularity), held-out evaluation with the
paired change since iteration 0, advantages, PPO ratio and clipping, loss and grad
norm, and the wall time of each phase."""

from __future__ import annotations

import io

PHASES = ("weight_push", "eval", "rollout", "reward", "learn")


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=85)
    plt.close(fig)
    return buf.getvalue()


def _series(rows: list[dict], key: str):
    pts = [(r["iteration"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def _axes(title: str, ylabel: str = ""):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), constrained_layout=True)
    ax.set(title=title, xlabel="iteration", ylabel=ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def rewards_figure(rows: list[dict]) -> bytes:
    fig, ax = _axes("rollout rewards (per reward model and granularity)", "mean reward")
    keys = sorted(k for k in rows[0] if k.startswith(("reward/", "anchor_reward/")))
    for key in keys:
        style = ":" if key.startswith("anchor") else ("-" if key.count("/") == 1 else "--")
        ax.plot(*_series(rows, key), style, label=key, lw=1.2)
    ax.legend(fontsize=7, ncol=2)
    return _png(fig)


def eval_figure(evaluations: list[dict]) -> bytes | None:
    """Held-out metrics over iterations; the band is the 95% CI of the paired change
    since the first evaluation (same prompts, same noise), drawn around its mean."""
    import numpy as np

    from ..common.stats import paired_difference, per_prompt_means

    if len(evaluations) < 2:
        return None
    fig, ax = _axes("held-out evaluation (fixed noise); band: 95% CI of the change", "mean")
    first = evaluations[0]
    n = len(first["prompts"])
    for metric in [m for m in first["scores"] if m.count("/") == 0 or m.endswith("/pass")]:
        its, means, lo, hi = [], [], [], []
        base = per_prompt_means(first["scores"][metric], n)
        for ev in evaluations:
            v = per_prompt_means(ev["scores"][metric], n)
            d = paired_difference(v, base)
            its.append(ev["iteration"])
            means.append(float(np.mean(v)))
            lo.append(base.mean() + d.lo)
            hi.append(base.mean() + d.hi)
        line = ax.plot(its, means, "o-", ms=3, label=metric)[0]
        ax.fill_between(its, lo, hi, color=line.get_color(), alpha=0.2)
    ax.legend(fontsize=8)
    return _png(fig)


def advantages_figure(rows: list[dict]) -> bytes:
    fig, ax = _axes("advantages and PPO ratio")
    for key in ("adv_abs_mean", "adv_std"):
        ax.plot(*_series(rows, key), label=key)
    ax.set_ylabel("advantage")
    twin = ax.twinx()
    for key, style in (("clip_fraction", "k--"), ("adv_clipped_frac", "r:")):
        twin.plot(*_series(rows, key), style, label=key)
    twin.set_ylim(0, 1)
    twin.set_ylabel("fraction")
    ax.legend(fontsize=7, loc="upper left")
    twin.legend(fontsize=7, loc="upper right")
    return _png(fig)


def ratio_figure(rows: list[dict]) -> bytes:
    fig, ax = _axes("PPO ratio range (1 ± clip range binds)", "ratio")
    for key in ("ratio_min", "ratio_mean", "ratio_max"):
        ax.plot(*_series(rows, key), label=key)
    ax.legend(fontsize=7)
    return _png(fig)


def loss_figure(rows: list[dict]) -> bytes:
    fig, ax = _axes("loss and gradient norm (before clipping)", "loss")
    ax.plot(*_series(rows, "loss"), label="loss")
    twin = ax.twinx()
    twin.plot(*_series(rows, "grad_norm"), "g-", label="grad_norm")
    ax.legend(fontsize=7, loc="upper left")
    twin.legend(fontsize=7, loc="upper right")
    return _png(fig)


def time_figure(rows: list[dict]) -> bytes:
    fig, ax = _axes("seconds per iteration, by phase (critical path)", "s")
    x = [r["iteration"] for r in rows]
    bottom = [0.0] * len(rows)
    for phase in PHASES:
        height = [float(r.get(f"time/{phase}_s", 0.0)) for r in rows]
        ax.bar(x, height, bottom=bottom, label=phase, width=0.9)
        bottom = [b + h for b, h in zip(bottom, height, strict=True)]
    ax.legend(fontsize=7)
    return _png(fig)


def run_figures(rows: list[dict], evaluations: list[dict]) -> list[tuple[str, str, bytes]]:
    """(id, caption, PNG) of every figure of a run's report."""
    figs = [("fig-rewards", "Rollout rewards", rewards_figure(rows))]
    ev = eval_figure(evaluations)
    if ev is not None:
        figs.append(("fig-eval", "Held-out evaluation", ev))
    figs += [
        ("fig-advantages", "Advantages and clipping", advantages_figure(rows)),
        ("fig-ratio", "PPO ratio", ratio_figure(rows)),
        ("fig-loss", "Loss and gradient norm", loss_figure(rows)),
        ("fig-time", "Time split", time_figure(rows)),
    ]
    return figs
