"""The plan as a report (table, JSON) and as the check ``g2rpo train`` runs first."""

from __future__ import annotations

import re

from ..common.config.run import G2RPOConfig
from ..common.errors import ConfigError
from .estimate import GiB, Plan, plan
from .remedies import GPU_FIELDS, remedies

EXIT_MISFIT = 3  # `g2rpo plan`: some actor does not fit (0: all fit, 2: bad input)


def parse_gib(text: str) -> float:
    """'80GiB', '80GB' (taken as GiB-sized GPU marketing), '80' -> 80.0; else ConfigError."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(GiB|GB|G)?\s*", text, flags=re.IGNORECASE)
    if not m or float(m.group(1)) <= 0:
        raise ConfigError(f"--gpu-memory: expected a size such as 80GiB or 141 (GiB), got {text!r}")
    return float(m.group(1))


def report(cfg: G2RPOConfig, gpu_memory_gib: float | None = None) -> dict:
    """The plan as plain data: actors with parts, verdicts and remedies."""
    p: Plan = plan(cfg, gpu_memory_gib)
    actors = []
    for a in p.actors:
        entry = {
            "actor": a.actor,
            "count": a.count,
            "num_gpus": a.gpus,
            "on_gpu": a.on_gpu,
            "peak_gib": round(a.peak / GiB, 2),
            "budget_gib": round(a.budget / GiB, 2),
            "fits": a.fits,
            "parts_gib": {k: round(v / GiB, 2) for k, v in a.parts.items()},
            "notes": list(a.notes),
        }
        if not a.fits:
            entry["remedies"] = [
                {"set": r.changes, "peak_gib": round(r.peak / GiB, 2)}
                for r in remedies(cfg, a.actor, gpu_memory_gib)
            ]
        actors.append(entry)
    return {
        "architecture": p.architecture,
        "gpu_memory_gib": round(p.gpu_memory / GiB, 2),
        "gpus_asked": p.gpus_asked,
        "fits": p.fits,
        "actors": actors,
    }


def format_table(rep: dict) -> str:
    lines = [
        f"architecture: {rep['architecture']}",
        f"GPUs asked of Ray: {rep['gpus_asked']:g}; GPU memory: {rep['gpu_memory_gib']:g} GiB",
        "",
        f"{'actor':<16}{'count':>6}{'GPUs':>6}{'peak GiB':>10}{'share GiB':>11}  verdict",
    ]
    for a in rep["actors"]:
        verdict = "fits" if a["fits"] else "DOES NOT FIT"
        if not a["on_gpu"]:
            verdict = "on CPU (not checked)"
        lines.append(
            f"{a['actor']:<16}{a['count']:>6}{a['num_gpus']:>6g}{a['peak_gib']:>10.2f}"
            f"{a['budget_gib']:>11.2f}  {verdict}"
        )
        for part, gib in a["parts_gib"].items():
            lines.append(f"    {gib:>9.2f}  {part}")
        lines += [f"    note: {n}" for n in a["notes"]]
        for r in a.get("remedies", []):
            lines.append(f"    fix: --set {' --set '.join(r['set'])}  -> {r['peak_gib']:.2f} GiB")
    lines.append("")
    lines.append("everything fits" if rep["fits"] else "some actor does not fit")
    return "\n".join(lines)


def refuse_misfit(cfg: G2RPOConfig) -> None:
    """Raise ConfigError naming each actor that cannot fit its GPU share, its largest
    parts and the fields that would fix it, when ``model.device`` is CUDA and
    ``train.memory.ignore_plan`` is false; the driver calls this before any actor."""
    if not cfg.model.device.startswith("cuda") or cfg.train.memory.ignore_plan:
        return
    rep = report(cfg)
    if rep["fits"]:
        return
    lines = [
        f"the memory plan says this run cannot fit {rep['gpu_memory_gib']:g} GiB GPUs "
        f"(train.memory.gpu_memory_gib), planned for {rep['architecture']}:"
    ]
    for a in rep["actors"]:
        if a["fits"]:
            continue
        top = sorted(a["parts_gib"].items(), key=lambda kv: -kv[1])[:3]
        made = ", ".join(f"{k} {v:.1f}" for k, v in top)
        field = GPU_FIELDS[a["actor"]]
        lines.append(
            f"  {a['actor']} ({field}={a['num_gpus']:g}): {a['peak_gib']:.1f} GiB > "
            f"{a['budget_gib']:.1f} GiB; largest parts (GiB): {made}"
        )
        for r in a.get("remedies", []):
            lines.append(f"    fits with {' '.join(r['set'])} ({r['peak_gib']:.1f} GiB)")
    lines.append("see `g2rpo plan CONFIG`; train.memory.ignore_plan=true starts it anyway")
    raise ConfigError("\n".join(lines))
