"""The run's actors on Ray: start them where the config's resources say (and stop
whatever started if anything fails), record where they run, stop them."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import ray

from ..common.cluster.ray_init import init_ray
from ..common.cluster.timeouts import collective_timeout_s, worker_start_timeout_s
from ..common.config.run import G2RPOConfig
from ..common.errors import RunFailed
from ..learner.actor import Learner
from ..learner.group import LearnerGroup
from ..reward_server.replicas import RewardSource
from ..rollout_worker.actor import RolloutWorker
from .placement import (
    PlacementError,
    in_bundle,
    learner_placement_group,
    local_cluster_resources,
    ray_resources,
    reward_placements,
    wait_group_placed,
    wait_placed,
)
from .reward_check import WAIT_S, check_scorers_served
from .shared_dir import nodes_of, probe_nodes

# with kept actors left beside a run's new ones: how long its actors may take to be
# placed and started before the kept ones are stopped to make room (a new actor
# importing torch on a busy node takes seconds; one that found no room, forever)
KEPT_ROOM_WAIT_S = 60.0


@dataclass
class RunActors:
    learner: LearnerGroup | None = None
    learner_pg: object = None  # the learner ranks' placement group: kept across recovery
    workers: list = field(default_factory=list)
    rewards: RewardSource | None = None
    evaluator: object = None  # train.eval.on_actor: a worker that only evaluates

    def stop(self) -> None:
        if self.rewards is not None:
            self.rewards.close()
        if self.learner is not None:
            self.learner.kill()
        if self.learner_pg is not None:
            ray.util.remove_placement_group(self.learner_pg)
        for actor in [*self.workers, self.evaluator]:
            if actor is not None:
                ray.kill(actor, no_restart=True)


def record_actors(run_dir: Path, actors: RunActors) -> None:
    """Where every actor runs (node, pid, assigned resources) and the reward servers'
    pids, for operators and the fault tests; rewritten every iteration and at the end
    of a session, as Ray restarts actors and replicas restart their servers."""
    rewards = actors.rewards
    evaluator = [actors.evaluator] if actors.evaluator is not None else []
    try:
        everyone = [*actors.workers, *rewards.replicas, *evaluator]
        calls = actors.learner.placement_refs() + [a.placement.remote() for a in everyone]
        calls += [r.server_pid.remote() for r in rewards.replicas]
        answers = ray.get(calls, timeout=30)
    except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
        return  # an actor is restarting: the next iteration records it
    k, n, m = len(actors.learner.ranks), len(actors.workers), len(rewards.replicas)
    learners, answers = answers[:k], answers[k:]
    placed, servers = answers[: len(answers) - m], answers[len(answers) - m :]
    evaluator_info = placed[n + m] if evaluator else None
    replicas = [
        {**info, "url": url, "server_pid": pid}
        for info, url, pid in zip(placed[n : n + m], rewards.replica_urls, servers, strict=True)
    ]
    record = {
        "learners": [info["pid"] for info in learners],
        "rollout_workers": [info["pid"] for info in placed[:n]],
        "reward_servers": servers,
        "placement": {
            "learner": learners[0],  # rank 0, which publishes
            "learners": learners,
            "rollout_workers": placed[:n],
            "reward_replicas": replicas,
            "evaluator": evaluator_info,
        },
    }
    try:  # readers (operators, tests) never see a half-written file
        tmp = run_dir / "actors.json.tmp"
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(tmp, run_dir / "actors.json")
    except OSError as exc:  # a full or read-only disk must not end the run here
        print(f"could not write {run_dir / 'actors.json'}: {exc}", file=sys.stderr)


def new_rollout_workers(cfg: dict, indices: list[int], options: dict) -> list:
    return [RolloutWorker.options(**options).remote(cfg, i) for i in indices]


def new_learner_group(cfg: G2RPOConfig, options: dict, pg) -> LearnerGroup:
    """A learner group whose rank i is placed in bundle i of ``pg``."""
    n, cfg_dict = cfg.train.learner.count, cfg.model_dump(mode="json")
    ranks = [Learner.options(**in_bundle(options, pg, r)).remote(cfg_dict, r, n) for r in range(n)]
    return LearnerGroup(cfg, options, ranks)


def start_ray(cfg: G2RPOConfig, redis_url: str | None) -> None:
    """The cluster RAY_ADDRESS names (as a job joins it), else a local Ray with the
    resources the config asks for and Ray's default object store (30% of RAM: a
    published version is a few objects of its size)."""
    if ray.is_initialized():
        return
    # Ray's INFO lines (started, connecting, connected) are not the run's output; on a
    # local Ray the actors' output would interleave with the progress bar (a cluster's
    # job shows it, train.actor_logs: common/cluster/ray_init.py)
    init_ray(
        actor_logs=cfg.train.actor_logs,
        **local_cluster_resources(cfg, redis_url),
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )


def start_actors(
    cfg: G2RPOConfig, redis_url: str | None, warm=None, run_dir: Path | None = None
) -> RunActors:
    """Ray (local unless RAY_ADDRESS points at a cluster), the reward replicas, the
    learner and the rollout workers, each placed by the resources the config asks
    (the learner ranks in a placement group of their own); with ``warm`` (a
    WarmActors), those an earlier run of this process left are taken first. Before any
    model loads, each scorer is checked to have a replica and ``run_dir`` to be one
    filesystem for every node (shared_dir.py). Whatever was started is stopped again
    if any of it fails."""
    start_ray(cfg, redis_url)
    t, cfg_dict = cfg.train, cfg.model_dump(mode="json")
    learner_opts = t.ray_options(t.learner)
    worker_opts = t.ray_options(t.workers)
    eval_opts = t.ray_options(t.eval)
    reward_opts = t.ray_options(t.reward)
    actors = RunActors()
    workers, kept = new_rollout_workers, None
    colocated = t.placement == "colocated"
    if colocated:
        warm = None  # kept actors were placed outside any run's bundles
    if warm is not None:
        warm.start_run()
        workers = warm.rollout_workers
        kept = warm.learner_group(cfg, learner_opts)
    try:
        if t.reward.in_pairs:  # the replicas go into the pairs' bundles: the group's first
            actors.learner_pg = learner_placement_group(cfg)
            wait_group_placed(actors.learner_pg, cfg, t.placement_timeout_s)
        in_pairs = reward_placements(cfg, actors.learner_pg, redis_url)
        actors.rewards = RewardSource(cfg, redis_url, in_pairs)
        if t.reward.job_replicas(redis_url) == 0:
            endpoints = actors.rewards.endpoints()
            check_scorers_served(
                actors.rewards.scorers,
                endpoints.urls,
                endpoints.redis_url,
                endpoints.token,
                wait_s=min(WAIT_S, t.reward.deadline_s),
                redis_password=endpoints.redis_password,
                ca_file=t.reward.tls_ca_file,
            )
        if kept is not None:
            actors.learner, actors.learner_pg = kept
        else:
            if actors.learner_pg is None:
                actors.learner_pg = learner_placement_group(cfg)
                wait_group_placed(actors.learner_pg, cfg, t.placement_timeout_s)
            actors.learner = new_learner_group(cfg, learner_opts, actors.learner_pg)
        if colocated:  # rollout worker i in bundle i, beside learner rank i
            actors.workers = [
                new_rollout_workers(cfg_dict, [i], in_bundle(worker_opts, actors.learner_pg, i))[0]
                for i in range(t.workers.count)
            ]
        else:
            actors.workers = workers(cfg_dict, list(range(t.workers.count)), worker_opts)
        groups = []
        if t.eval.on_actor:  # a worker of its own that only evaluates (index -1: no rollouts)
            (actors.evaluator,) = workers(cfg_dict, [-1], eval_opts)
            groups.append(
                ("train.eval (num_cpus/num_gpus/resources)", [actors.evaluator], eval_opts)
            )
        if warm is not None:  # kept actors this run did not take, where room is short
            started = [*warm.started, *[reward_opts] * len(actors.rewards.replicas)]
            started += [learner_opts] * len(actors.learner.ranks) if kept is None else []
            warm.release_unused(needed=ray_resources(started))
        placed = [
            ("train.reward (num_cpus/num_gpus/resources)", actors.rewards.replicas, reward_opts),
            ("train.learner (num_cpus/num_gpus/resources)", actors.learner.ranks, learner_opts),
            ("train.workers (num_cpus/num_gpus/resources)", actors.workers, worker_opts),
            *groups,
        ]
        if warm is not None and warm.holds_unused():
            try:  # another driver may have taken the room they were left in
                where = wait_placed(placed, min(t.placement_timeout_s, KEPT_ROOM_WAIT_S))
            except PlacementError:
                warm.release_unused()
                where = wait_placed(placed, t.placement_timeout_s)
        else:
            where = wait_placed(placed, t.placement_timeout_s)
        if run_dir is not None:  # before any model loads: checkpoints must reach the driver
            kinds = ("learner rank", "rollout worker", "evaluator")
            probe_nodes(run_dir, nodes_of(list(zip(kinds, where[1:], strict=False))), 60.0)
        # placed; now load the models and start the servers while the learner group
        # forms (rank 0 reads its weights before it: learner/group.py), errors surface
        # in the waits
        everyone = [*actors.rewards.replicas, *actors.workers]
        everyone += [actors.evaluator] if actors.evaluator is not None else []
        starting = [a.ready.remote() for a in everyone]
        actors.learner.form()
        wait_started(starting, actors.learner, cfg)
        actors.rewards.refresh(strict=True)
    except BaseException:
        actors.stop()
        raise
    return actors


def wait_started(starting: list, learner: LearnerGroup, cfg: G2RPOConfig) -> None:
    """Every actor's ``ready()`` (``starting``: their refs; its models loaded, its
    server up) and the learner ranks', within the scaled start timeouts; a timeout
    names the field that bounds it."""
    starts = [(ref, "train.workers.start_timeout_s") for ref in starting]
    starts += [(ref, "train.collective_timeout_s") for ref in learner.ready_refs()]
    limit = max(worker_start_timeout_s(cfg), collective_timeout_s(cfg))
    refs = [ref for ref, _ in starts]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=limit)
    if len(ready) < len(refs):
        late = sorted({field for ref, field in starts if ref not in ready})
        raise RunFailed(
            f"{len(refs) - len(ready)} of {len(refs)} actors did not load their models "
            f"within {limit:.0f} s ({', '.join(late)}; None scales with the weights' size "
            "on disk: common/cluster/timeouts.py)"
        )
    ray.get(refs)  # raise the first actor's own error, if one failed


def call_with_restart(
    make_call,
    actor,
    attempts: int = 3,
    timeout: float | None = None,
    restart_s: float = 300.0,
):
    """Run an actor call; if the actor died, wait for Ray to restart it and redo it
    (``make_call`` must bring a fresh actor to the state the call needs). While Ray
    is still restarting it (ActorUnavailableError: a new process importing torch on a
    busy node takes seconds) the call is tried again every second for up to
    ``restart_s`` (``train.workers.start_timeout_s``, scaled with the pipeline); only a
    call that reached the actor and saw it die counts against ``attempts``. The
    restarted actor's start (its ``ready()``: a new process loading its pipeline) is
    waited for on that clock too, and RunFailed names that field when it runs out;
    ``timeout`` is for the call itself (``train.workers.rollout_timeout_s``), which
    raises ray's GetTimeoutError when not back by then."""
    deadline, deaths = time.monotonic() + restart_s, 0
    while True:
        try:
            try:
                ray.get(actor.ready.remote(), timeout=max(1.0, deadline - time.monotonic()))
            except ray.exceptions.GetTimeoutError:
                raise RunFailed(
                    f"an actor Ray restarted did not load its pipeline again within "
                    f"train.workers.start_timeout_s={restart_s:.0f} s (None scales it with "
                    "the pipeline's size on disk: common/cluster/timeouts.py)"
                ) from None
            return ray.get(make_call(actor), timeout=timeout)
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
        except ray.exceptions.RayActorError:
            deaths += 1
            if deaths >= attempts or time.monotonic() > deadline:
                raise
        time.sleep(1.0)


def get_or_redo(ref, make_call, actor, timeout: float | None, restart_s: float = 300.0):
    """The answer of a call already made (``ref``); if the actor died, or was stuck
    past ``timeout`` (then it is killed), Ray restarts it and the call is made
    again on the new one (``make_call`` brings it to the state the call needs). A
    redo not back within ``timeout`` raises ray's GetTimeoutError."""
    try:
        return ray.get(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        ray.kill(actor, no_restart=False)  # stuck: Ray restarts it
    except ray.exceptions.RayActorError:
        pass
    return call_with_restart(make_call, actor, timeout=timeout, restart_s=restart_s)
