"""``g2rpo doctor``'s host-memory phase: this node's RAM, /dev/shm and Ray object store
against what the plan says a node of the run needs (``host_nodes.py``).

Read here: MemTotal from /proc/meminfo; /dev/shm's size from ``os.statvfs`` (its blocks x
fragment size: a tmpfs's limit, a pod's emptyDir sizeLimit); the object store from
``--object-store-memory``, or from the Ray this process is connected to (or the one
RAY_ADDRESS names) for this node. Each shortfall names what is short, by how much, and
the setting that gives it: the node's (pod's) memory, /dev/shm's size, Ray's
object-store-memory."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..common.config.run import G2RPOConfig
from .host_nodes import NodeHost, host_plan, node_label

GiB = 2**30


@dataclass(frozen=True)
class NodeMemory:
    mem_total: int  # bytes
    dev_shm: int | None  # bytes (None: no /dev/shm)
    object_store: int | None  # bytes (None: not known)
    object_store_from: str = ""


def parse_size(text: str) -> int:
    """Bytes, as Ray's --object-store-memory takes them, or 56GiB / 56Gi / 512MiB."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(GiB|Gi|G|MiB|Mi|M)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"expected bytes or a size such as 56GiB, got {text!r}")
    unit = (m.group(2) or "").lower()[:1]
    return int(float(m.group(1)) * {"": 1, "g": GiB, "m": 2**20}[unit])


def mem_total(meminfo: str = "/proc/meminfo") -> int:
    with open(meminfo) as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise OSError(f"{meminfo}: no MemTotal line")


def dev_shm_bytes(path: str = "/dev/shm") -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def running_object_store() -> int | None:
    """This node's object store in the Ray this process joined, or the one RAY_ADDRESS
    names (joined for the question, then left); None without Ray."""
    try:
        import ray
    except ImportError:
        return None
    joined = False
    if not ray.is_initialized():
        if not os.environ.get("RAY_ADDRESS"):
            return None
        import logging

        ray.init(address=os.environ["RAY_ADDRESS"], logging_level=logging.ERROR)
        joined = True
    try:
        here = ray.util.get_node_ip_address()
        stores = [
            n["Resources"].get("object_store_memory", 0)
            for n in ray.nodes()
            if n.get("Alive") and n.get("NodeManagerAddress") == here
        ]
        return int(max(stores)) if stores else None
    finally:
        if joined:
            ray.shutdown()


def this_node(object_store: int | None = None) -> NodeMemory:
    if object_store is not None:
        return NodeMemory(mem_total(), dev_shm_bytes(), object_store, "--object-store-memory")
    running = running_object_store()
    return NodeMemory(mem_total(), dev_shm_bytes(), running, "the running Ray" if running else "")


def node_to_check(nodes: list[NodeHost], name: str | None) -> NodeHost:
    """The node ``name`` names, else the run's most demanding node but the head (the
    one any node that may host actors must hold)."""
    if name is not None:
        found = [n for n in nodes if n.name == name]
        if not found:
            names = ", ".join(n.name for n in nodes)
            raise ValueError(f"--node {name!r}: the plan's nodes are {names}")
        return found[0]
    return max((n for n in nodes if not n.head), key=lambda n: n.peak)


def shortfalls(node: NodeHost, have: NodeMemory) -> list[str]:
    """What this node lacks to be ``node``, each with its setting; empty: it fits."""
    out = []

    def gib(n: int) -> str:
        return f"{n / GiB:.1f} GiB"

    if have.mem_total < node.peak:
        out.append(
            f"MemTotal {gib(have.mem_total)} is short of {node.name}'s host RAM at "
            f"{node.peak_phase} ({gib(node.peak)}) by {gib(node.peak - have.mem_total)}: "
            f"give the node (a pod: its memory limit) at least {gib(node.peak)}"
        )
    if have.dev_shm is None or have.dev_shm < node.shm_bytes:
        size = "no /dev/shm" if have.dev_shm is None else f"/dev/shm {gib(have.dev_shm)}"
        short = node.shm_bytes - (have.dev_shm or 0)
        out.append(
            f"{size} is short of the {gib(node.shm_bytes)} {node.name} needs (its object "
            f"store and NCCL's segments) by {gib(short)}: raise /dev/shm (a pod: its "
            f"emptyDir medium Memory sizeLimit) to at least {gib(node.shm_bytes)}"
        )
    if have.object_store is not None and have.object_store < node.store_bytes:
        out.append(
            f"the object store ({have.object_store_from}) {gib(have.object_store)} is short "
            f"of the {gib(node.store_bytes)} {node.name} puts there by "
            f"{gib(node.store_bytes - have.object_store)}: start Ray with "
            f"--object-store-memory={node.store_bytes} (rayStartParams object-store-memory)"
        )
    known = have.object_store is not None and have.dev_shm is not None
    if known and have.object_store > have.dev_shm:
        out.append(
            f"the object store {gib(have.object_store)} is larger than /dev/shm "
            f"{gib(have.dev_shm)}: Ray puts it on disk; raise /dev/shm to at least it"
        )
    return out


def check_host(cfg: G2RPOConfig, gpus_per_node: int, node: str | None, have: NodeMemory) -> dict:
    """The host phase's details; raises ValueError naming every shortfall."""
    nodes = host_plan(cfg, gpus_per_node)
    target = node_to_check(nodes, node)
    details = {
        "node": node_label(target),
        "need_gib": round(target.peak / GiB, 2),
        "peak_phase": target.peak_phase,
        "MemTotal_gib": round(have.mem_total / GiB, 2),
        "dev_shm_need_gib": round(target.shm_bytes / GiB, 2),
        "dev_shm_gib": None if have.dev_shm is None else round(have.dev_shm / GiB, 2),
        "object_store_need_gib": round(target.store_bytes / GiB, 2),
        "object_store_gib": None
        if have.object_store is None
        else round(have.object_store / GiB, 2),
    }
    short = shortfalls(target, have)
    if short:
        raise HostShort("; ".join(short), details)
    return details


@dataclass(frozen=True)
class HostOptions:
    gpus_per_node: int = 8  # the plan's nodes (``g2rpo plan --gpus-per-node``)
    node: str | None = None  # the plan's node this one is to be (None: the largest)
    object_store: int | None = None  # bytes Ray's object store has here, when told
    only: bool = False  # the host phase alone (``--host-only``)


def run_host_phase(cfg: G2RPOConfig, options: HostOptions, result) -> None:
    """Fill the doctor's host phase ``result``; a shortfall raises (the phase fails)."""
    try:
        have = this_node(options.object_store)
        result.details = check_host(cfg, options.gpus_per_node, options.node, have)
    except HostShort as exc:
        result.details = exc.details
        raise


class HostShort(ValueError):
    """This node lacks what the plan's node needs; ``details`` says what was compared."""

    said = True  # its message is the whole story: the doctor prints no traceback

    def __init__(self, message: str, details: dict) -> None:
        super().__init__(message)
        self.details = details
