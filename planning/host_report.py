"""``g2rpo plan``'s host-memory section: each node's host RAM per phase, its object
store and /dev/shm (``host_nodes.py``), as data (``--json``) and as a table."""

from __future__ import annotations

from ..common.config.run import G2RPOConfig
from .host_memory import PHASES, PROCESS_BYTES
from .host_nodes import (
    NCCL_SHM_BYTES,
    RAY_HEAD_BYTES,
    RAY_NODE_BYTES,
    host_plan,
    node_label,
)

GiB = 2**30


def _gib(n: int) -> float:
    return round(n / GiB, 2)


def host_report(cfg: G2RPOConfig, gpus_per_node: int = 8) -> dict:
    nodes = host_plan(cfg, gpus_per_node)
    return {
        "gpus_per_node": gpus_per_node,
        "weights": "zero-copy (one copy per node in the object store)",
        "phases": list(PHASES),
        "nodes": [
            {
                "node": n.name,
                "label": node_label(n),
                "head": n.head,
                "gpus": n.gpus,
                "actors": n.kinds(),
                "phases_gib": {phase: _gib(n.phase_bytes(phase)) for phase in PHASES},
                "peak_gib": _gib(n.peak),
                "peak_phase": n.peak_phase,
                "object_store_gib": _gib(n.store_bytes),
                "dev_shm_gib": _gib(n.shm_bytes),
                "object_store_gib_parts": {k: _gib(v) for k, v in n.store.items()},
                "ray_gib": _gib(n.ray_bytes),
                "processes": [
                    {
                        "actor": p.actor,
                        "count": p.count,
                        "phases_gib": {
                            phase: {k: _gib(v) for k, v in p.phases[phase].items()}
                            for phase in PHASES
                        },
                    }
                    for p in n.processes
                ],
            }
            for n in nodes
        ],
        "assumptions_gib": {
            "process baseline (CUDA)": _gib(PROCESS_BYTES["cuda"]),
            "process baseline (CPU)": _gib(PROCESS_BYTES["cpu"]),
            RAY_NODE: _gib(RAY_NODE_BYTES),
            RAY_HEAD: _gib(RAY_HEAD_BYTES),
            NCCL: _gib(NCCL_SHM_BYTES),
        },
    }


def format_host(rep: dict) -> str:
    phases = rep["phases"]
    lines = [
        f"host memory per node, GiB (nodes of {rep['gpus_per_node']} GPUs: --gpus-per-node; "
        "weights zero-copy; a node's object store counted once, from the first publish on):",
        f"    {'':<8}" + "".join(f"{p:>11}" for p in phases) + f"{'peak':>8}{'store':>8}{'shm':>8}",
    ]
    for n in rep["nodes"]:
        cells = "".join(f"{n['phases_gib'][p]:>11.1f}" for p in phases)
        tail = f"{n['peak_gib']:>8.1f}{n['object_store_gib']:>8.1f}{n['dev_shm_gib']:>8.1f}"
        lines.append(f"    {n['node']:<8}{cells}{tail}")
    for n in rep["nodes"]:
        lines.append(f"    {n['label']}; peak at {n['peak_phase']}:")
        lines.append("        " + ", ".join(_peak_parts(n)))
    a = rep["assumptions_gib"]
    lines.append(
        f"    (store: object-store-memory; shm: /dev/shm. Assumed: a process's baseline "
        f"{a['process baseline (CUDA)']:g} GiB with CUDA, {a['process baseline (CPU)']:g} "
        f"without; Ray's processes {a[RAY_NODE]:g} GiB a node, {a[RAY_HEAD]:g} on the head; "
        f"NCCL {a[NCCL]:g} GiB of /dev/shm a GPU node)"
    )
    return "\n".join(lines)


RAY_NODE, RAY_HEAD = "Ray's processes on a node", "Ray's processes on the head"
NCCL = "NCCL shared memory on a GPU node"


def _peak_parts(n: dict) -> list[str]:
    """The node's peak phase, summed by what each kind of process holds, largest first."""
    phase = n["peak_phase"]
    parts: dict[str, float] = {}
    for p in n["processes"]:
        for k, v in p["phases_gib"][phase].items():
            key = f"{p['actor']} x{p['count']}: {k}" if p["count"] > 1 else f"{p['actor']}: {k}"
            parts[key] = parts.get(key, 0.0) + p["count"] * v
    if phase != "load" and n["object_store_gib"]:
        parts["object store"] = n["object_store_gib"]
    parts["Ray's processes"] = n["ray_gib"]
    return [f"{v:.1f} {k}" for k, v in sorted(parts.items(), key=lambda x: -x[1]) if v >= 0.05]
