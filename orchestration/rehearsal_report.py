"""What a rehearsal measured, read back from its run directory and its nodes'
directories, and the table `g2rpo rehearse` prints."""

from __future__ import annotations

import json
from pathlib import Path

MiB = 2**20
# the metrics rows' phase timings reported, by what a user calls them
ROW_PHASES = {
    "publish": "time/publish_s",
    "weight push (rank 0 + slowest worker load)": "time/weight_push_s",
    "rollout + reward (driver's wait)": "time/rollout_and_reward_s",
    "rollout (slowest worker)": "time/rollout_s",
    "reward (slowest worker)": "time/reward_s",
    "learn": "time/learn_s",
    "evaluation wait": "time/eval_s",
    "evaluation work": "time/eval_work_s",
    "iteration": "time/iteration_s",
}


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def phase_seconds(run_dir: Path) -> dict[str, list[float]]:
    """Each phase's seconds in each recorded iteration."""
    rows = _rows(run_dir)
    out = {}
    for name, key in ROW_PHASES.items():
        values = [round(r[key], 3) for r in rows if key in r]
        if values:
            out[name] = values
    return out


def sizes(run_dir: Path) -> dict[str, int]:
    """The largest of each thing that moved: a reward request's body, a published
    version, a worker's trajectory batch (bytes), and the requests per iteration."""
    rows = _rows(run_dir)
    out = {}
    for name, key in (
        ("reward_request_bytes", "reward_request_bytes"),
        ("reward_requests_per_iteration", "reward_requests"),
        ("published_weights_bytes", "weights_bytes"),
        ("trajectory_batch_bytes", "trajectory_bytes"),
    ):
        values = [r[key] for r in rows if key in r]
        if values:
            out[name] = max(values)
    return out


def actors_memory(run_dir: Path, faults) -> list[dict]:
    """Each actor's peak resident memory, as actors.json last recorded it."""
    path = run_dir / "actors.json"
    if not path.is_file():
        return []
    placement = json.loads(path.read_text())["placement"]
    out = []
    for kind in ("learners", "rollout_workers", "reward_replicas"):
        for i, info in enumerate(placement.get(kind) or []):
            out.append(_actor(kind, i, info))
    if placement.get("evaluator"):
        out.append(_actor("evaluator", 0, placement["evaluator"]))
    return out


def _actor(kind: str, index: int, info: dict) -> dict:
    return {
        "actor": f"{kind} {index}",
        "node": info.get("node_ip", "?") + " " + info.get("node_id", "?")[:8],
        "peak_rss_bytes": info.get("peak_rss_bytes"),
    }


def files_by_node(out: Path, nodes: list[str]) -> dict[str, dict]:
    """Where the files landed: each node's own directory (its working directory and
    its private mounts) and the shared run directory: file count, bytes, and a few
    paths."""
    places = {"shared run directory": out / "runs"}
    places.update({name: out / "nodes" / name for name in nodes})
    report = {}
    for name, root in places.items():
        files = [p for p in root.rglob("*") if p.is_file()] if root.is_dir() else []
        report[name] = {
            "files": len(files),
            "bytes": sum(p.stat().st_size for p in files),
            "some": sorted(str(p.relative_to(root)) for p in files)[:12],
        }
    return report


def _size(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n / 1024:.1f} KiB"


def format_report(report: dict) -> str:
    lines = [f"rehearsal of {report['recipe']}: " + ("PASSED" if report["passed"] else "FAILED")]
    if not report["passed"]:
        f = report["failure"]
        lines.append(f"  failed in phase {f['phase']} (look at {f['field']}): {f['error'][:600]}")
    lines += [f"  {line}" for line in report["rule"]]
    lines.append(
        "nodes: head (driver; no CPU or GPU for actors) + "
        + ", ".join(f"{n['name']} ({n['num_gpus']} GPUs declared)" for n in report["nodes"])
    )
    lines.append(
        "faults: "
        + (
            ", ".join(
                f"{who} (pid {what['pid']}) SIGKILLed" for who, what in report["faults"].items()
            )
            or "none injected"
        )
    )
    lines.append("seconds per phase (each iteration, or each time):")
    for name, values in report["seconds"].items():
        lines.append(f"  {name:<44} {', '.join(f'{v:.1f}' for v in values)}")
    lines.append("bytes:")
    for name, value in report["bytes"].items():
        shown = _size(value) if name.endswith("bytes") else str(value)
        lines.append(f"  {name:<44} {shown}")
    lines.append("host memory peak per actor:")
    for a in report["memory"]:
        rss = a["peak_rss_bytes"]
        lines.append(f"  {a['actor']:<28} {a['node']:<28} {(rss or 0) / MiB:8.0f} MiB")
    if report.get("object_store_peak_bytes"):
        lines.append("object store peak per node:")
        for node, value in report["object_store_peak_bytes"].items():
            spilled = report["object_store_spilled_bytes"].get(node, 0)
            lines.append(f"  {node:<44} {value / MiB:.0f} MiB (spilled {spilled / MiB:.0f} MiB)")
    lines.append("files by where they landed:")
    for place, what in report["files"].items():
        lines.append(
            f"  {place:<28} {what['files']:>5} files {what['bytes'] / MiB:9.1f} MiB  "
            + ", ".join(what["some"][:4])
        )
    lines.append("evaluations (what catches reward hacking: health measures, drift, train.guard):")
    for e in report.get("evaluations", []):
        g = e["guard"]
        guard = (
            f"guard crossed {g.get('guard/crossed')}, missing {g.get('guard/missing')}"
            if g
            else "guard: no reading"
        )
        lines.append(
            f"  iteration {e['iteration']:<6} {e['samples']} samples, {len(e['health'])} "
            f"measures, drift {'yes' if e['drift'] else 'none'}, {guard}"
        )
    return "\n".join(lines)


def evaluations(run_dir: Path, cfg) -> list[dict]:
    """Each evaluation's image-health measures (the names its record holds a value of for
    every sample), its drift entries (``eval/drift/*``, against the first evaluation) and
    train.guard's reading (``guard/*``, from its record): what a run of the recipe records
    to catch reward hacking."""
    from ..run_directory.eval_rows import drift_entries, evaluation_change
    from ..run_directory.files import read_evaluations

    records = read_evaluations(run_dir)
    trained = {r.name: r.weight for r in cfg.rewards}
    out = []
    for record in records:
        n = len(next(iter(record["scores"].values()), []))
        health = record.get("health", {})
        full = sorted(k for k, v in health.items() if len(v) == n and not _all_nan(v))
        row = evaluation_change(records[0], record) if record is not records[0] else {}
        out.append(
            {
                "iteration": record["iteration"],
                "samples": n,
                "health": full,
                "drift": drift_entries(row, trained) if row else {},
                "guard": record.get("guard", {}),
            }
        )
    return out


def _all_nan(values) -> bool:
    return all(v is None or v != v for v in values)
