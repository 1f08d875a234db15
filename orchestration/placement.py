"""Placing the run's actors by the resources the config asks for, and saying
clearly which request the cluster cannot meet instead of waiting forever."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable

import ray

from ..common.config.run import G2RPOConfig
from ..common.errors import G2RPOError

# while actors wait for room, say what waits this often (a run on a small cluster had
# printed nothing for train.placement_timeout_s, 10 minutes, then failed: issue 58)
WAIT_REPORT_S = 30.0


class PlacementError(G2RPOError, RuntimeError):
    """An actor the cluster did not place in time; names the config fields."""


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _wait_saying(
    refs: list, timeout_s: float, waiting: Callable[[set], str], say: Callable[[str], None]
) -> set:
    """``ray.wait`` for all of ``refs`` up to ``timeout_s``; every ``WAIT_REPORT_S``
    still waiting, one line: how long, ``waiting(ready)`` (what waits and what it asks)
    and what the cluster has free. Returns the refs ready."""
    start = time.monotonic()
    while True:
        left = start + timeout_s - time.monotonic()
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=max(0.0, min(WAIT_REPORT_S, left)))
        if len(ready) == len(refs) or left <= WAIT_REPORT_S:
            return set(ready)
        say(
            f"waiting {time.monotonic() - start:.0f} s for room "
            f"(train.placement_timeout_s={timeout_s:g}): {waiting(set(ready))}; the cluster "
            f"has {_summary(ray.available_resources())} free of "
            f"{_summary(ray.cluster_resources())}"
        )


def local_cluster_resources(cfg: G2RPOConfig, redis_url: str | None = None) -> dict:
    """What a one-machine Ray needs to place every actor of this config: the CPU
    count and each custom resource summed over the actors, so a config written for
    a cluster (custom node labels included) runs unchanged on a laptop. GPUs are
    left to Ray's detection: asking for a GPU the laptop lacks must fail."""
    t, r = cfg.train, cfg.train.reward
    counted = (
        (t.workers.count, t.workers),
        (t.learner.count, t.learner),
        (int(t.eval.on_actor), t.eval),
        (r.job_replicas(redis_url), r),
    )
    cpus = sum(count * kind.num_cpus for count, kind in counted)
    custom: dict[str, float] = {}
    for count, kind in counted:
        for name, amount in kind.resources.items():
            custom[name] = custom.get(name, 0.0) + count * amount
    # a node declares whole units (Ray refuses 2.5); actors may still ask fractions
    whole = {name: float(math.ceil(amount)) for name, amount in custom.items()}
    return {"num_cpus": max(2, math.ceil(cpus)), "resources": whole}


def ray_resources(options: list[dict]) -> dict:
    """The Ray resources a list of actor options asks for in all ({"CPU": 3, ...};
    those asked for none left out)."""
    total: dict = {}
    for o in options:
        asked = {"CPU": o.get("num_cpus", 0), "GPU": o.get("num_gpus", 0), **o.get("resources", {})}
        for name, amount in asked.items():
            if amount:
                total[name] = total.get(name, 0) + amount
    return total


def _summary(resources: dict) -> dict:
    skip = ("node:", "memory", "object_store_memory", "accelerator_type:")
    return {k: v for k, v in sorted(resources.items()) if not k.startswith(skip)}


def wait_placed(
    groups: list[tuple[str, list, dict]],
    timeout_s: float,
    say: Callable[[str], None] = _say,
) -> list[list[dict]]:
    """Wait until every actor answers ``placement()``. ``groups`` holds (config
    field, actor handles, the options they asked for). While waiting, every
    ``WAIT_REPORT_S`` ``say`` names what waits, what it asks and what is free. On
    timeout, name the field of every group not placed, what it asked for and what the
    cluster has: first those asking for more than the whole cluster holds (they never
    will be placed), then those a busy cluster was merely slow to start."""
    pending = [[h.placement.remote() for h in handles] for _, handles, _ in groups]
    everything = [ref for refs in pending for ref in refs]

    def not_placed(ready: set) -> list[tuple[str, int, int, dict]]:
        """(field, actors, of them not placed, what each asks) of each group waiting."""
        out = []
        for (field, handles, options), refs in zip(groups, pending, strict=True):
            if missing := sum(ref not in ready for ref in refs):
                out.append((field, len(handles), missing, ray_resources([options])))
        return out

    def waiting(ready: set) -> str:
        return "; ".join(
            f"{field}: {missing} of {n} asking {asked} each"
            for field, n, missing, asked in not_placed(ready)
        )

    ready = _wait_saying(everything, timeout_s, waiting, say)
    if len(ready) == len(everything):
        return [ray.get(refs) for refs in pending]
    total = ray.cluster_resources()
    unplaced = []  # (placeable, line): the impossible ones sort first
    for field, n, missing, asked in not_placed(ready):
        placeable = all(total.get(name, 0.0) >= amount for name, amount in asked.items())
        unplaced.append(
            (
                placeable,
                f"{field}: {missing} of {n} actor(s) asking {asked} each were "
                f"not placed within train.placement_timeout_s={timeout_s:g}s"
                + ("" if placeable else " (more than the whole cluster has)"),
            )
        )
    unplaced.sort(key=lambda u: u[0])
    raise PlacementError(
        "; ".join(line for _, line in unplaced) + f"; the cluster has {_summary(total)} in "
        f"total, {_summary(ray.available_resources())} free"
    )


def learner_bundles(cfg: G2RPOConfig) -> list[dict[str, float]]:
    """One Ray bundle per learner rank: its CPUs, custom resources and GPUs. With
    several ranks each bundle reserves whole GPUs (a rank asking 0.5 still gets a GPU
    no other rank of its group can be given: NCCL refuses two ranks on one device);
    a single learner reserves just its share, so it may pack beside other actors.
    Colocated (``train.placement``), bundle i also holds rollout worker i: both kinds'
    CPUs and custom resources, and one whole GPU when either asks for a share of one
    (Ray gives the two that same GPU, and no other bundle's rank can have it). With
    ``train.reward.in_pairs`` the bundles of ``train.reward_bundles()`` also hold a reward
    replica's CPUs and custom resources; its GPU share is of the bundle's one GPU."""
    t = cfg.train
    learner = t.learner
    hosts = set(t.reward_bundles())
    out = []
    for index in range(learner.count):
        kinds = [learner]
        if t.placement == "colocated":
            kinds.append(t.workers)
        if index in hosts:  # train.reward.in_pairs: this pair's replica too
            kinds.append(t.reward)
        bundle = {"CPU": sum(k.num_cpus for k in kinds), "GPU": t.bundle_gpus()}
        for kind in kinds:
            for name, amount in kind.resources.items():
                bundle[name] = bundle.get(name, 0.0) + amount
        bundle = {name: float(amount) for name, amount in bundle.items() if amount > 0}
        # a bundle cannot be empty: a learner asking for nothing still holds a sliver of CPU
        out.append(bundle or {"CPU": 0.001})
    return out


def reward_placements(cfg: G2RPOConfig, pg, redis_url: str | None = None) -> list[dict] | None:
    """Each job-started reward replica's placement options in the learner group's
    placement group ``pg`` (``train.reward.in_pairs``), else None (they go wherever
    their resources are)."""
    bundles = cfg.train.reward_bundles(redis_url)
    if not bundles:
        return None
    return [in_bundle({}, pg, index) for index in bundles]


def learner_placement_group(cfg: G2RPOConfig):
    """The learner group's placement group (``train.learner.placement_strategy``,
    STRICT_PACK by default: the ranks' FSDP2 traffic stays inside one node). It
    outlives the ranks: a group formed again after a rank died is placed in it again."""
    from ray.util import placement_group

    return placement_group(learner_bundles(cfg), strategy=cfg.train.learner.placement_strategy)


def in_bundle(options: dict, pg, index: int) -> dict:
    """``options`` for an actor placed in bundle ``index`` of ``pg``. An actor asking
    for no CPU or GPU still takes a sliver of its bundle's CPU (Ray places an actor in a
    bundle by the resources it takes from it)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = PlacementGroupSchedulingStrategy(
        pg, placement_group_bundle_index=index, placement_group_capture_child_tasks=False
    )
    return {**options, "scheduling_strategy": strategy}


def wait_group_placed(
    pg, cfg: G2RPOConfig, timeout_s: float, say: Callable[[str], None] = _say
) -> None:
    """Wait for the learner group's bundles, saying every ``WAIT_REPORT_S`` what waits;
    on timeout PlacementError names the fields and what the cluster's nodes have (the
    strategy asks them of one node, or of distinct ones)."""
    bundles, strategy = learner_bundles(cfg), cfg.train.learner.placement_strategy
    what = f"the learner group's {len(bundles)} bundles of {bundles[0]} ({strategy})"
    if _wait_saying([pg.ready()], timeout_s, lambda _: what, say):
        return
    nodes = [
        _summary(n["Resources"])
        for n in ray.nodes()
        if n.get("Alive") and n["Resources"].get("CPU", 0) + n["Resources"].get("GPU", 0) > 0
    ]
    ray.util.remove_placement_group(pg)
    whose = (
        "train.learner and train.workers, train.placement colocated"
        if cfg.train.placement == "colocated"
        else "train.learner"
    )
    raise PlacementError(
        f"{whose}: {len(bundles)} bundles of {bundles[0]} ({strategy}, "
        "train.learner.placement_strategy) were not placed within "
        f"train.placement_timeout_s={timeout_s:g}s"
        + (
            f": STRICT_PACK needs one node holding all {len(bundles)} (PACK lets them spread)"
            if strategy == "STRICT_PACK" and len(bundles) > 1
            else ""
        )
        + f"; the cluster's nodes have {nodes}, {_summary(ray.available_resources())} free"
    )


def object_store_too_small(nbytes: int) -> str | None:
    """A line saying so when a published version (``nbytes``) is more than half the
    smallest object store of the cluster's nodes that run actors (a worker may hold
    the version being loaded and the next one; a bigger one spills to disk at every
    publish), else None."""
    stores = [
        n["Resources"].get("object_store_memory", 0)
        for n in ray.nodes()
        if n.get("Alive") and n["Resources"].get("CPU", 0) + n["Resources"].get("GPU", 0) > 0
    ]
    if not stores or 2 * nbytes <= min(stores):
        return None
    return (
        f"a published weight version is {nbytes / 2**30:.1f} GiB and a node's object store "
        f"{min(stores) / 2**30:.1f} GiB: each publish will spill to disk; start the nodes "
        f"with ray start --object-store-memory={2 * nbytes + 2**30} (and /dev/shm at least that)"
    )
