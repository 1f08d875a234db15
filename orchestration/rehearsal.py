"""``g2rpo rehearse CONFIG``: the recipe's whole data flow at its true sizes, on a Ray
cluster of several nodes started on this machine, before a GPU is paid for.

The recipe runs as `g2rpo train` runs it (rehearsal_setup.py says what changes: the
models, the numbers' precision, the actor counts; never a request's or an object's
size), on a head that holds the driver and worker nodes that share no filesystem but
the declared model/prompt volume and the run directory (local_nodes.py). It runs two
sessions: the first trains until one iteration is left and has a rollout worker
SIGKILLed in its first rollout (Ray restarts it, its share is redone); the second
resumes the run (`--resume`), has a learner rank SIGKILLed before its first publish
(the group is formed again from the last checkpoint), finishes the run, exports it and
evaluates the final weights. Every iteration checkpoints.

It reports per phase the seconds, the bytes of each reward request, published
version and trajectory batch, each actor's host-memory peak, each node's
object-store peak, and which files landed on which node; any failure ends it with
exit 1 naming the phase and the config field to look at."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from ..common.config.loading import dump_config, load_config
from ..common.config.run import G2RPOConfig

# the phase each hook point starts (TrainingLoop.at), and the field a failure in a
# phase points at when its message names none
PHASE_OF_POINT = {
    "publish": "publish",
    "rollout": "rollout_and_reward",
    "learn": "learn",
    "checkpoint": "checkpoint",
    "checkpointed": "record",
    "export": "export",
    "final_evaluation": "evaluate",
    "finished": "finish",
}
PHASE_FIELDS = {
    "cluster": "train.placement_timeout_s",
    "start": "train.workers.start_timeout_s",
    "publish": "train.weights.transport",
    "rollout_and_reward": "train.reward.request_mib",
    "learn": "train.learner.max_batch",
    "checkpoint": "run.output_dir",
    "record": "run.output_dir",
    "resume": "run.output_dir",
    "export": "run.output_dir",
    "evaluate": "train.eval.samples",
    "finish": "run.output_dir",
}


@dataclass
class Faults:
    """The driver's hooks: which phase the run is in, the faults it injects, and the
    seconds of what the metrics rows do not time (checkpoints, session starts)."""

    session: int = 1
    phase: str = "start"
    session_started: float = field(default_factory=time.monotonic)
    killed: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    worker_pids: list = field(default_factory=list)
    _since: float = 0.0
    _final: bool = False

    def _add(self, name: str, seconds: float) -> None:
        self.seconds.setdefault(name, []).append(round(seconds, 3))

    def new_session(self, session: int) -> None:
        self.session, self.phase = session, "resume" if session > 1 else "start"
        self.session_started = time.monotonic()

    def at(self, point: str, loop, it: int) -> None:
        import ray

        now = time.monotonic()
        if self.phase in ("start", "resume"):  # actors placed and loaded, checkpoint read
            self._add(f"session_{self.session}_start", now - self.session_started)
        if point == "publish" and self.session == 1 and not self.worker_pids:
            self.worker_pids = ray.get([w.pid.remote() for w in loop.actors.workers])
        if point == "rollout" and self.session == 1 and "rollout worker 0" not in self.killed:
            time.sleep(1.0)  # into its share: killed while it rolls out
            os.kill(self.worker_pids[0], signal.SIGKILL)
            self.killed["rollout worker 0"] = {"pid": self.worker_pids[0], "iteration": it}
        if point == "publish" and self.session == 2 and not self._learner_killed():
            ranks = ray.get(loop.actors.learner.placement_refs())
            victim = len(ranks) - 1
            os.kill(ranks[victim]["pid"], signal.SIGKILL)
            self.killed[f"learner rank {victim}"] = {"pid": ranks[victim]["pid"]}
        if point == "checkpoint":
            self._since = now
        if point == "checkpointed":
            self._add("checkpoint", now - self._since)
        if point == "export":
            self._since = now
        if point == "final_evaluation":
            if self._since:
                self._add("export", now - self._since)
            self._since, self._final = now, True
        if point == "finished" and self._final:
            self._add("final evaluation", now - self._since)
        # the final evaluation publishes first: it stays the phase a failure names
        if not (self._final and point == "publish"):
            self.phase = PHASE_OF_POINT[point]

    def _learner_killed(self) -> bool:
        return any(who.startswith("learner") for who in self.killed)


class ObjectStoreWatch:
    """Each node's object-store bytes in use, sampled every ``every_s`` (Ray's raylet
    stats; Ray has no public per-node API for it: ``ray._private.internal_api``)."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.peak: dict[str, int] = {}
        self.spilled: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)
        self._thread.start()

    def _run(self, every_s: float) -> None:
        import ray
        from ray._private.internal_api import node_stats

        while not self._stop.wait(every_s):
            try:
                nodes = [n for n in ray.nodes() if n["Alive"]]
                for n in nodes:
                    stats = node_stats(
                        n["NodeManagerAddress"], n["NodeManagerPort"], include_memory_info=False
                    ).store_stats
                    key = n["NodeID"]
                    self.peak[key] = max(self.peak.get(key, 0), stats.object_store_bytes_used)
                    self.spilled[key] = max(self.spilled.get(key, 0), stats.spilled_bytes_total)
            except Exception:  # a node going away mid-sample: the next sample counts
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@dataclass
class RehearsalResult:
    passed: bool
    report: dict
    out: Path


def rehearse(
    config: str | Path,
    overrides: list[str],
    out: Path,
    *,
    nodes: int = 2,
    iterations: int = 2,
    shared_run_dir: bool = True,
    progress: bool = False,
) -> RehearsalResult:
    """Rehearse the recipe at ``config`` under ``out`` (module docstring)."""
    import ray

    from .local_nodes import LocalCluster
    from .rehearsal_report import actors_memory, evaluations, files_by_node, phase_seconds, sizes
    from .rehearsal_setup import build_models, rehearsal_of, write_prompts

    out = Path(out).absolute()
    recipe = load_config(config, overrides)
    plan = rehearsal_of(recipe, out, nodes, iterations, shared_run_dir)
    cfg = load_config(config, [*overrides, *plan.overrides])
    report: dict = {
        "recipe": str(config),
        "overrides": list(overrides),
        "rule": plan.rule,
        "nodes": [vars(n) for n in plan.nodes],
        "iterations": iterations,
    }
    faults, cluster, watch = Faults(), LocalCluster(out), None
    run_dir = out / "runs" / cfg.run.name
    failure = None
    try:
        faults.phase = "cluster"
        build_models(cfg, out, plan.scorers)
        write_prompts(recipe, out)
        (out / "rehearsal.yaml").write_text(dump_config(cfg))
        store = object_store_bytes(cfg)
        private = [] if shared_run_dir else [out / "runs"]
        nodes = [
            dict(
                name=spec.name,
                num_cpus=spec.num_cpus,
                num_gpus=spec.num_gpus,
                resources=spec.resources,
                object_store_bytes=store,
                private=private,
            )
            for spec in plan.nodes
        ]
        cluster.start(store, nodes, say=lambda line: print(line, file=sys.stderr, flush=True))
        ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
        cluster.wait_for(len(plan.nodes) + 1)
        report["node_ids"] = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        watch = ObjectStoreWatch()
        _sessions(cfg, out, run_dir, faults, iterations, progress)
    except BaseException as exc:
        failure = _failure(faults.phase, exc)
        if isinstance(exc, KeyboardInterrupt):
            raise
    finally:
        if watch is not None:
            watch.stop()
            report["object_store_peak_bytes"] = _by_node(watch.peak, report)
            report["object_store_spilled_bytes"] = _by_node(watch.spilled, report)
        if failure is not None:
            _keep_logs(cluster, out)
        if ray.is_initialized():
            ray.shutdown()
        cluster.stop()
    report["faults"] = faults.killed
    report["seconds"] = {**phase_seconds(run_dir), **faults.seconds}
    report["bytes"] = sizes(run_dir)
    report["memory"] = actors_memory(run_dir, faults)
    report["files"] = files_by_node(out, [n.name for n in plan.nodes])
    report["evaluations"] = evaluations(run_dir, cfg) if run_dir.is_dir() else []
    report["passed"] = failure is None
    if failure is not None:
        report["failure"] = failure
    (out / "rehearsal.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    return RehearsalResult(failure is None, report, out)


def _sessions(cfg: G2RPOConfig, out: Path, run_dir: Path, faults, iterations, progress):
    """Session 1: all iterations but the last, a worker killed in the first rollout.
    Session 2: resumed, a learner rank killed before its first publish, finished."""
    from .driver import train

    faults.new_session(1)
    train(
        out / "rehearsal.yaml", [], progress=progress, max_iterations=iterations - 1, hooks=faults
    )
    faults.new_session(2)
    train(None, ["run.max_failures=1"], resume=run_dir, progress=progress, hooks=faults)


def object_store_bytes(cfg: G2RPOConfig) -> int:
    """Each node's object store: Ray's default share of this machine's memory, split
    over the nodes it runs, at least 1 GiB."""
    import psutil

    return max(2**30, int(0.3 * psutil.virtual_memory().total / 4))


def _by_node(values: dict[str, int], report: dict) -> dict:
    ips = report.get("node_ids", {})
    return {f"{key[:8]} ({ips.get(key, '?')})": v for key, v in values.items()}


def _failure(phase: str, exc: BaseException) -> dict:
    """What failed, in which phase, and the config field to look at."""
    from ..planning.doctor_fields import FIELD_IN_MESSAGE, is_config_field

    cause = getattr(exc, "cause", None) or exc  # a RayTaskError carries the actor's error
    message = f"{type(cause).__name__}: {cause}".strip()
    named = [m.group(0) for m in FIELD_IN_MESSAGE.finditer(message)]
    fields = [f for f in named if is_config_field(f)]
    return {
        "phase": phase,
        "field": fields[0] if fields else PHASE_FIELDS.get(phase, ""),
        "error": message[:4000],
        "traceback": "".join(traceback.format_exception(exc))[-6000:],
    }


def _keep_logs(cluster, out: Path) -> None:
    """On a failure, the nodes' Ray logs (actors' stderr among them) under ``out``
    before the nodes' temp dirs go."""
    import shutil

    for node in cluster.nodes:
        logs = Path(node.temp_dir) / "session_latest" / "logs"
        if logs.is_dir():
            shutil.copytree(logs, out / "logs" / node.name, dirs_exist_ok=True)
