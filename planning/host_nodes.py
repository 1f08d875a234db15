"""Each node's host memory per phase, its object store and /dev/shm: the processes
``host_memory.py`` sizes, laid out on nodes as the run's placement puts them.

The layout (GPU runs; nodes of ``gpus_per_node`` GPUs, each GPU shared by actors whose
``num_gpus`` fractions fit in it):

* the learner group's bundles first (``train.learner.placement_strategy``: STRICT_PACK on
  one node, PACK filling nodes in order, SPREAD one rank per node); colocated, rollout
  worker i in rank i's bundle. Learner rank 0 is on the first learner node;
* then the other rollout workers, the evaluator (``train.eval.on_actor``) and the job's
  reward replicas, each on the first GPU with room (a replica that asks for a custom
  resource, ``train.reward.resources``, on nodes of its own: the node offering it);
* the driver on a head node of its own, without GPUs.

A CPU run puts every actor on one node beside the head.

A node's object store holds (``object_store_bytes``): where learner rank 0 runs, the
versions it put that are still referenced (object-store transport: the new one while the
driver still holds the last, and with ``train.weights.staleness >= 1`` the one the rollout
in flight uses; collective: the versions a fallback or a restarted worker may be given);
elsewhere a node's workers read one version, copied there (older copies are evicted to
make room); the trajectory batches its workers put, and where learner ranks run every
worker's batch (each rank reads them there); on the head an evaluation's images. Its pages
are shared memory (/dev/shm, counted once however many processes map them) and stay
resident until Ray needs the room: counted in every phase but the first load.

A node's phase is the sum of its processes, each at its own peak in that phase: where
those peaks come at different moments it is an upper bound (a colocated rank 0 gathers
the version before the ranks step aside: flux_hps_8gpu's publish is 3.2 GiB above the
moment the workers load).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..common.config.run import G2RPOConfig
from ..common.errors import ConfigError
from ..learner.staged_versions import versions_kept
from .estimate import architecture, plan
from .host_memory import (
    PHASES,
    ProcessHost,
    driver_host,
    hands_over_on_device,
    learner_host,
    model_sizes,
    reward_host,
    worker_host,
)

GiB = 2**30
RAY_NODE_BYTES = 1 * GiB  # raylet, its agents and log monitor on each node (assumed)
RAY_HEAD_BYTES = 2 * GiB  # on the head: those and the GCS and dashboard (assumed)
NCCL_SHM_BYTES = 1 * GiB  # NCCL's shared-memory segments between a node's GPUs (assumed)


@dataclass
class NodeHost:
    name: str
    gpus: float  # GPUs its actors reserve
    head: bool = False
    processes: list[ProcessHost] = field(default_factory=list)
    store: dict[str, int] = field(default_factory=dict)  # object store contents by kind

    @property
    def store_bytes(self) -> int:
        return sum(self.store.values())

    @property
    def ray_bytes(self) -> int:
        return RAY_HEAD_BYTES if self.head else RAY_NODE_BYTES

    @property
    def shm_bytes(self) -> int:
        """/dev/shm: the object store lives there (Ray falls back to disk, slowly, when
        it is smaller), and NCCL's segments beside it on a node of GPUs."""
        return self.store_bytes + (NCCL_SHM_BYTES if self.gpus > 0 else 0)

    def phase_bytes(self, phase: str) -> int:
        store = 0 if phase == "load" else self.store_bytes
        return self.ray_bytes + store + sum(p.count * p.bytes(phase) for p in self.processes)

    @property
    def peak_phase(self) -> str:
        return max(PHASES, key=self.phase_bytes)

    @property
    def peak(self) -> int:
        return self.phase_bytes(self.peak_phase)

    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.processes:
            kind = "learner rank" if p.actor.startswith("learner rank") else p.actor
            out[kind] = out.get(kind, 0) + p.count
        return out

    def count(self, actor: str) -> int:
        return sum(p.count for p in self.processes if p.actor.startswith(actor))


class _Slots:
    """GPU nodes being filled: each a list of its GPUs' free fractions, and its actors."""

    def __init__(self, gpus_per_node: int) -> None:
        self.per_node = gpus_per_node
        self.free: list[list[float]] = []
        self.actors: list[dict[str, int]] = []

    def new_node(self) -> int:
        self.free.append([1.0] * self.per_node)
        self.actors.append({})
        return len(self.free) - 1

    def _take(self, node: int, gpus: float) -> bool:
        free = self.free[node]
        if gpus <= 0:
            return True
        if gpus <= 1:
            for i, f in enumerate(free):
                if f >= gpus - 1e-9:
                    free[i] = f - gpus
                    return True
            return False
        whole = [i for i, f in enumerate(free) if f >= 1 - 1e-9]
        if len(whole) < math.ceil(gpus):
            return False
        for i in whole[: math.ceil(gpus)]:
            free[i] = 0.0
        return True

    def put(self, actor: str, gpus: float, nodes: list[int] | None = None) -> int:
        """``actor`` on the first of ``nodes`` (default: every node, then a new one) with
        room for ``gpus``."""
        for node in range(len(self.free)) if nodes is None else nodes:
            if self._take(node, gpus):
                break
        else:
            node = self.new_node()
            if not self._take(node, gpus):
                raise ConfigError(
                    f"an actor asking {gpus:g} GPUs does not fit a node of {self.per_node} "
                    "(--gpus-per-node)"
                )
        self.actors[node][actor] = self.actors[node].get(actor, 0) + 1
        return node


def _layout(cfg: G2RPOConfig, gpus_per_node: int) -> list[dict[str, int]]:
    """Actors per node (kinds: "learner rank 0", "learner rank", "rollout worker",
    "evaluator", "reward replica"), in the order described in the module docstring."""
    t = cfg.train
    slots = _Slots(gpus_per_node)
    colocated = t.placement == "colocated"
    bundle = t.bundle_gpus()
    strategy = t.learner.placement_strategy if t.learner.count > 1 else "STRICT_PACK"
    if strategy == "STRICT_PACK" and t.learner.count * bundle > gpus_per_node:
        raise ConfigError(
            f"train.learner: {t.learner.count} bundles of {bundle:g} GPUs on one node "
            f"(placement_strategy STRICT_PACK) need more than {gpus_per_node} GPUs a node "
            "(--gpus-per-node, or train.learner.placement_strategy PACK)"
        )
    node = None
    hosts = t.reward_bundles()  # train.reward.in_pairs: the bundles holding a replica
    for rank in range(t.learner.count):
        kind = "learner rank 0" if rank == 0 else "learner rank"
        if strategy in ("SPREAD", "STRICT_SPREAD") or node is None:
            node = slots.new_node()
        where = [node] if strategy != "PACK" else list(range(node, len(slots.free)))
        node = slots.put(kind, bundle, where)
        beside = ["rollout worker"] if colocated else []  # their shares of the rank's bundle
        beside += ["reward replica"] * hosts.count(rank)
        for other in beside:
            slots.actors[node][other] = slots.actors[node].get(other, 0) + 1
    if not colocated:
        for _ in range(t.workers.count):
            slots.put("rollout worker", t.workers.num_gpus)
    elif t.workers.count != t.learner.count:
        raise ConfigError("train.placement colocated: train.workers.count = train.learner.count")
    if t.eval.on_actor:
        slots.put("evaluator", t.eval.num_gpus)
    own: list[int] = []  # nodes offering train.reward.resources: the replicas' own
    for _ in range(0 if hosts else t.reward.job_replicas()):
        if not t.reward.resources:
            slots.put("reward replica", t.reward.num_gpus)
            continue
        own = own or [slots.new_node()]
        node = slots.put("reward replica", t.reward.num_gpus, own)
        own += [] if node in own else [node]
    return slots.actors


def _store(cfg: G2RPOConfig, s, actors: dict[str, int], workers_total: int) -> dict[str, int]:
    w = cfg.train.weights
    out: dict[str, int] = {}
    kept = versions_kept(w.staleness)
    if actors.get("learner rank 0") and hands_over_on_device(cfg):
        # handed over on the GPUs; the store holds a version only for a worker Ray
        # restarted (or the evaluator), put when one needs it: sized for it all the same
        out["a version for a restarted worker or the evaluator (1)"] = s.version
    elif actors.get("learner rank 0"):
        versions = kept + 1 if w.transport == "object_store" else kept
        out[f"weight versions put by learner rank 0 ({versions})"] = versions * s.version
    elif actors.get("rollout worker") or actors.get("evaluator"):
        out["the weight version its workers load (a copy)"] = s.version
    in_flight = 2 if w.staleness >= 1 else 1
    learners = actors.get("learner rank 0", 0) + actors.get("learner rank", 0)
    batches = workers_total if learners else actors.get("rollout worker", 0)
    if batches:
        out[f"trajectory batches ({batches} x {in_flight} in flight)"] = (
            batches * in_flight * s.trajectory
        )
    return out


def host_plan(cfg: G2RPOConfig, gpus_per_node: int = 8) -> list[NodeHost]:
    """The head and every node of ``cfg``'s run, with their processes' host memory per
    phase and their object stores."""
    archs, _ = architecture(cfg)
    s = model_sizes(cfg, archs)
    peaks = {a.actor: a.peak for a in plan(cfg).actors}
    t = cfg.train
    if cfg.model.device.startswith("cuda"):
        layout = _layout(cfg, gpus_per_node)
    else:  # a CPU run: every actor on one node
        layout = [
            {
                "learner rank 0": 1,
                "learner rank": t.learner.count - 1,
                "rollout worker": t.workers.count,
                "evaluator": int(t.eval.on_actor),
                "reward replica": t.reward.job_replicas(),
            }
        ]
    head = NodeHost("head", 0.0, head=True, processes=[driver_host(s)])
    head.store["an evaluation's images"] = s.eval_images
    nodes = [head]
    for i, actors in enumerate(layout):
        node = NodeHost(f"node {i + 1}", 0.0)
        for kind, n in actors.items():
            if n <= 0:
                continue
            if kind.startswith("learner rank"):
                p = learner_host(cfg, s, kind == "learner rank 0", n, peaks["learner rank"])
            elif kind == "reward replica":
                p = reward_host(cfg, s, n)
            else:
                p = worker_host(cfg, s, kind, n, peaks.get(kind, 0))
            node.processes.append(p)
        node.gpus = _node_gpus(cfg, node)
        node.store = _store(cfg, s, actors, t.workers.count)
        nodes.append(node)
    return nodes


def _node_gpus(cfg: G2RPOConfig, node: NodeHost) -> float:
    if not cfg.model.device.startswith("cuda"):
        return 0.0
    t = cfg.train
    colocated = t.placement == "colocated"
    gpus = node.count("learner rank") * t.bundle_gpus()
    gpus += 0 if colocated else node.count("rollout worker") * t.workers.num_gpus
    gpus += node.count("evaluator") * t.eval.num_gpus
    if not t.reward.in_pairs:  # else shares of the pairs' bundles
        gpus += node.count("reward replica") * t.reward.num_gpus
    return gpus


def node_label(node: NodeHost) -> str:
    if node.head:
        return "head: the driver"
    kinds = ", ".join(f"{n} {k}{'s' if n > 1 else ''}" for k, n in node.kinds().items())
    return f"{node.name}: {kinds} ({math.ceil(node.gpus - 1e-9)} GPUs)"
