"""The figures of a run's report as PNG bytes: the run's curve panels one per
figure (run_directory.plots), and the held-out evaluation with the paired change since
iteration 0 drawn as a band."""

from __future__ import annotations

import io

from ..run_directory.plots import (
    draw_advantages,
    draw_loss,
    draw_ratio,
    draw_rewards,
    draw_time,
    pyplot,
)


def _figure(draw, data) -> bytes:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6), constrained_layout=True)
    ax.grid(alpha=0.3)
    draw(ax, data)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=85)
    plt.close(fig)
    return buf.getvalue()


def draw_eval(ax, evaluations: list[dict]) -> None:
    """Held-out metrics over iterations; the band is the 95% CI of the paired change
    since the first evaluation (same prompts, same noise), drawn around its level."""
    import numpy as np

    from ..common.algorithms.stats import paired_difference, per_prompt_means

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
    ax.set(
        title="held-out evaluation (fixed noise); band: 95% CI of the change", xlabel="iteration"
    )
    ax.legend(fontsize=8)


def run_figures(rows: list[dict], evaluations: list[dict]) -> list[tuple[str, str, bytes]]:
    """(id, caption, PNG) of every figure of a run's report."""
    figs = [
        (
            "fig-rewards",
            "Rollout rewards per reward model and granularity",
            _figure(lambda ax, r: draw_rewards(ax, r, granularities=True), rows),
        )
    ]
    if len(evaluations) >= 2:
        figs.append(("fig-eval", "Held-out evaluation", _figure(draw_eval, evaluations)))
    figs += [
        ("fig-advantages", "Advantages", _figure(draw_advantages, rows)),
        ("fig-ratio", "PPO ratio and clipping", _figure(draw_ratio, rows)),
        ("fig-loss", "Loss and gradient norm", _figure(draw_loss, rows)),
        ("fig-time", "Time split", _figure(draw_time, rows)),
    ]
    return figs
