"""The photographs check's outputs: results.json, table.md and detection.png (the results of
evaluation/photo_check.run_check, written as a reader looks at them)."""

from __future__ import annotations

import json
from pathlib import Path

from g2rpo.evaluation import photo_hacks as ph
from g2rpo.evaluation.photo_sets import render_section

STRENGTHS = ("mild", "strong")


def _pct(p: dict | None) -> str:
    if not p or p["n"] == 0:
        return "–"
    return f"{p['k']}/{p['n']} = {100 * p['rate']:.0f}% [{100 * p['lo']:.0f}, {100 * p['hi']:.0f}]"


def _short(p: dict) -> str:
    return "–" if p["n"] == 0 else f"{p['k']}/{p['n']}"


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.4g}"


def detection_rows(results: dict) -> list[str]:
    """One row per hack × strength, one column per size: detection by a tied measure
    (with its 95% interval), and by any measure."""
    sizes = list(results["per_size"])
    head = "| hack | strength | " + " | ".join(f"{s}²: tied [95% CI] · any" for s in sizes) + " |"
    lines = [head, "|" + "---|" * (2 + len(sizes))]
    for hack in ph.HACKS:
        for strength in STRENGTHS:
            cells = []
            for size in sizes:
                d = results["per_size"][size]["detection"][hack][strength]
                cells.append(f"{_pct(d['tied'])} · {_short(d['any'])}")
            lines.append(f"| {hack} | {strength} | " + " | ".join(cells) + " |")
    for strength in STRENGTHS:
        for kind in ("photos", "crops"):
            found = [results["per_size"][s]["groups"]["detection"][strength][kind] for s in sizes]
            cells = [f"{_pct(p)} · diversity only" for p in found]
            lines.append(f"| collapse (vs {kind} group) | {strength} | " + " | ".join(cells) + " |")
    return lines


def false_alarm_rows(results: dict) -> list[str]:
    sizes = list(results["per_size"])
    lines = ["| clean variation | " + " | ".join(f"{s}²" for s in sizes) + " |"]
    lines.append("|" + "---|" * (1 + len(sizes)))
    fa = [results["per_size"][s]["false_alarm"] for s in sizes]
    lines.append(
        "| **all (any measure)** | " + " | ".join(f"**{_pct(f['overall'])}**" for f in fa) + " |"
    )
    for kind in ph.CLEAN_KINDS:
        lines.append(f"| {kind} | " + " | ".join(_pct(f["by_kind"][kind]) for f in fa) + " |")
    for kind in ("photos", "crops"):
        cells = [_pct(results["per_size"][s]["groups"]["false_alarm"][kind]) for s in sizes]
        lines.append(f"| group of other {kind} (diversity) | " + " | ".join(cells) + " |")
    cells = [_pct(f["choosing_in_sample"]) for f in fa]
    lines.append("| (choosing photographs, in sample) | " + " | ".join(cells) + " |")
    return lines


def measure_rows(results: dict) -> list[str]:
    """Each measure's threshold, its false-alarm rate on the judging clean variations,
    and its share of each strong hack flagged, per size."""
    sizes = list(results["per_size"])
    lines = []
    for size in sizes:
        r = results["per_size"][size]
        hacks = list(ph.HACKS)
        lines.append(
            f"\n**{size}²** (per_image {r['cost']['per_image_ms']:.0f} ms an image, "
            f"thumbnails {r['cost']['thumbnails_ms']:.1f} ms; {r['cost']['images']} images)\n"
        )
        lines.append(
            "| measure | threshold | clean FA | " + " | ".join(f"{h} strong" for h in hacks) + " |"
        )
        lines.append("|" + "---|" * (3 + len(hacks)))
        for m, t in r["thresholds"].items():
            kind = "rel." if m in results["measures"]["relative"] else "abs."
            cells = [_fmt(r["detection"][h]["strong"]["by_measure"][m]) for h in hacks]
            fa = _fmt(r["false_alarm"]["by_measure"][m])
            lines.append(f"| {m} | {t:.4g} ({kind}) | {fa} | " + " | ".join(cells) + " |")
        lines.append(
            f"| diversity | {r['groups']['threshold']:.4g} (rel., falls) | – | "
            + " | ".join("–" for _ in hacks)
            + " |"
        )
    return lines


def render_table(results: dict) -> str:
    s = results["settings"]
    goal = results["goal"]
    met = ", ".join(f"{size}²: {'met' if g['met'] else 'NOT met'}" for size, g in goal.items())
    parts = [
        "# Image-health measures on photographs with known hacks",
        "",
        f"`{results['command']}` at {results['git_commit'] or 'no git commit'}"
        f"{' (uncommitted changes)' if results.get('git_dirty') else ''}, "
        f"{results['wall_s']:.0f} s ({results.get('cpu_s', 0):.0f} s of CPU). "
        f"Thresholds from {len(s['choosing'])} choosing photographs' clean variations "
        f"(each the smallest with ≤ {100 * s['fa_target']:g}% false alarms there); judged on "
        f"{len(s['judging'])} other photographs with variations from other seeds. "
        f"Intervals: {results['ci']}.",
        "",
        "Goal (every hack found at its strong strength by a tied measure, ≤ 5% false alarms): "
        f"{met}.",
        "",
        "## Detection (judging photographs)",
        "",
        "tied: flagged by a measure tied to the hack; any: by any measure.",
        "",
        *detection_rows(results),
        "",
        "## False alarms on clean variations (judging photographs)",
        "",
        *false_alarm_rows(results),
        "",
        "## Each measure: threshold, false alarms, share of strong hacks it flags",
        *measure_rows(results),
        "",
    ]
    if "set_level" in results:  # evaluation/photo_sets.py: the guard's decision shape
        parts += [*render_section(results), ""]
    return "\n".join(parts)


def plot(results: dict, path: Path) -> None:
    """Tied detection rate per hack × strength and size, with its interval, and the clean
    false-alarm rate as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(results["per_size"])
    names = [*ph.HACKS, "collapse_(photos_group)"]
    labels = [f"{h.replace('_', chr(10))}\n{st}" for h in names for st in STRENGTHS]
    fig, ax = plt.subplots(figsize=(12, 4.2))
    width = 0.8 / len(sizes)
    for i, size in enumerate(sizes):
        r = results["per_size"][size]
        props = [r["detection"][h][st]["tied"] for h in ph.HACKS for st in STRENGTHS]
        props += [r["groups"]["detection"][st]["photos"] for st in STRENGTHS]
        rates = [p["rate"] or 0 for p in props]
        err = [
            [p["rate"] - p["lo"] if p["n"] else 0 for p in props],
            [p["hi"] - p["rate"] if p["n"] else 0 for p in props],
        ]
        x = [j + (i - (len(sizes) - 1) / 2) * width for j in range(len(labels))]
        bars = ax.bar(x, rates, width, yerr=err, capsize=2, label=f"{size}²")
        fa = r["false_alarm"]["overall"]["rate"]
        ax.axhline(fa, color=bars.patches[0].get_facecolor(), ls="--", lw=1)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("detected (tied measure), 95% CI")
    ax.set_title("Hacks detected on held-out photographs; dashed: clean false-alarm rate")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(results: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "table.md", out / "detection.png"]
    paths[0].write_text(json.dumps(results, indent=1) + "\n")
    paths[1].write_text(render_table(results))
    plot(results, paths[2])
    return paths
