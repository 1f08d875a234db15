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

from ..common.config import G2RPOConfig
from ..common.ray_init import init_ray
from ..learner.group import LearnerGroup
from ..reward_server.replicas import RewardSource
from ..rollout_worker.actor import RolloutWorker
from .placement import PlacementError, local_cluster_resources, ray_resources, wait_placed

# with kept actors left beside a run's new ones: how long its actors may take to be
# placed and started before the kept ones are stopped to make room (a new actor
# importing torch on a busy node takes seconds; one that found no room, forever)
KEPT_ROOM_WAIT_S = 60.0


@dataclass
class RunActors:
    learner: LearnerGroup | None = None
    workers: list = field(default_factory=list)
    rewards: RewardSource | None = None
    evaluator: object = None  # train.eval.on_actor: a worker that only evaluates

    def stop(self) -> None:
        if self.rewards is not None:
            self.rewards.close()
        if self.learner is not None:
            self.learner.kill()
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


def start_actors(cfg: G2RPOConfig, redis_url: str | None, warm=None) -> RunActors:
    """Ray (local unless RAY_ADDRESS points at a cluster), the reward replicas, the
    learner and the rollout workers, each placed by the resources the config asks;
    with ``warm`` (a WarmActors), those an earlier run of this process left are taken
    first. Whatever was started is stopped again if any of it fails."""
    if not ray.is_initialized():
        # Ray's INFO lines (started, connecting, connected) are not the run's output
        init_ray(
            **local_cluster_resources(cfg, redis_url),
            include_dashboard=False,
            object_store_memory=512 * 2**20,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    t, r, cfg_dict = cfg.train, cfg.train.reward, cfg.model_dump(mode="json")
    learner_opts = t.learner.ray_options()
    worker_opts = t.workers.ray_options()
    eval_opts = t.eval.ray_options()
    reward_opts = r.ray_options()
    actors = RunActors()
    workers, kept_ranks = new_rollout_workers, None
    if warm is not None:
        warm.start_run()
        workers = warm.rollout_workers
        kept_ranks = warm.learner_ranks(cfg_dict, t.learner.count, learner_opts)
    try:
        actors.rewards = RewardSource(cfg, redis_url)
        actors.learner = LearnerGroup(cfg, learner_opts, kept_ranks)
        actors.workers = workers(cfg_dict, list(range(t.workers.count)), worker_opts)
        groups = []
        if t.eval.on_actor:  # a worker of its own that only evaluates (index -1: no rollouts)
            (actors.evaluator,) = workers(cfg_dict, [-1], eval_opts)
            groups.append(
                ("train.eval (num_cpus/num_gpus/resources)", [actors.evaluator], eval_opts)
            )
        if warm is not None:  # kept actors this run did not take, where room is short
            started = [*warm.started, *[reward_opts] * len(actors.rewards.replicas)]
            started += [learner_opts] * len(actors.learner.ranks) if kept_ranks is None else []
            warm.release_unused(needed=ray_resources(started))
        placed = [
            ("train.reward (num_cpus/num_gpus/resources)", actors.rewards.replicas, reward_opts),
            ("train.learner (num_cpus/num_gpus/resources)", actors.learner.ranks, learner_opts),
            ("train.workers (num_cpus/num_gpus/resources)", actors.workers, worker_opts),
            *groups,
        ]
        if warm is not None and warm.holds_unused():
            try:  # another driver may have taken the room they were left in
                wait_placed(placed, min(t.placement_timeout_s, KEPT_ROOM_WAIT_S))
            except PlacementError:
                warm.release_unused()
                wait_placed(placed, t.placement_timeout_s)
        else:
            wait_placed(placed, t.placement_timeout_s)
        # placed; now form the learner group, load the models and start the servers
        # (errors surface here)
        actors.learner.form()
        everyone = [*actors.rewards.replicas, *actors.workers]
        everyone += [actors.evaluator] if actors.evaluator is not None else []
        ray.get([a.ready.remote() for a in everyone] + actors.learner.ready_refs())
        actors.rewards.refresh(strict=True)
    except BaseException:
        actors.stop()
        raise
    return actors


def call_with_restart(
    make_call, actor, attempts: int = 3, timeout: float | None = None, restart_s: float = 300.0
):
    """Run an actor call; if the actor died, wait for Ray to restart it and redo it
    (``make_call`` must bring a fresh actor to the state the call needs). While Ray
    is still restarting it (ActorUnavailableError: a new process importing torch on a
    busy node takes seconds) the call is tried again every second for up to
    ``restart_s``; only a call that reached the actor and saw it die counts against
    ``attempts``. The restarted actor's start (its ``ready()``: a new process loading
    its pipeline) is waited for on that clock too; ``timeout`` is for the call itself,
    which raises ray's GetTimeoutError when not back by then."""
    deadline, deaths = time.monotonic() + restart_s, 0
    while True:
        try:
            ray.get(actor.ready.remote(), timeout=max(1.0, deadline - time.monotonic()))
            return ray.get(make_call(actor), timeout=timeout)
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
        except ray.exceptions.RayActorError:
            deaths += 1
            if deaths >= attempts or time.monotonic() > deadline:
                raise
        time.sleep(1.0)


def get_or_redo(ref, make_call, actor, timeout: float | None):
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
    return call_with_restart(make_call, actor, timeout=timeout)
