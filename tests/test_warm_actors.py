"""Actors kept warm between runs (orchestration/warm_actors.py) on a real local Ray:
a kept worker serves the run that took it, also after Ray restarted it (its
creation arguments are an earlier run's config), and kept learner ranks are taken
only by a group of their size."""

import os
import signal
import time

import pytest
import ray
from g2rpo.common.config.loading import load_config
from g2rpo.orchestration.warm_actors import WarmActors
from small_run import SMALL_RUN

pytestmark = pytest.mark.slow  # a Ray cluster


def _cfg(world, name: str, *extra: str) -> dict:
    over = [*SMALL_RUN, f"model.pretrained={world / 'pipeline'}", f"run.name={name}", *extra]
    return load_config(None, over).model_dump(mode="json")


class _Ended:
    """What ``keep`` reads of a run that ended (no reward replicas, no evaluator)."""

    def __init__(self, workers=(), learner=None, learner_pg=None):
        self.workers, self.evaluator, self.rewards, self.learner = workers, None, None, learner
        self.learner_pg = learner_pg


def _group(cfg, options):
    """A learner group in a placement group of its own, as a run starts one."""
    from g2rpo.orchestration.cluster import new_learner_group
    from g2rpo.orchestration.placement import learner_placement_group

    pg = learner_placement_group(cfg)
    ray.get(pg.ready(), timeout=60)
    group = new_learner_group(cfg, options, pg)
    return group, _Ended(learner=group, learner_pg=pg)


def _load(world, name, *extra):
    return load_config(None, [*SMALL_RUN, f"model.pretrained={world / 'pipeline'}", *extra])


def test_a_kept_worker_restarted_by_ray_serves_the_run_that_took_it(ray_local, world):
    warm = WarmActors()
    options = {"num_cpus": 1}
    try:
        warm.start_run()
        (first,) = warm.rollout_workers(_cfg(world, "first"), [0], options)
        before = ray.get(first.identity.remote())
        assert (before["run"], before["worker"]) == ("first", 0)
        warm.keep(_Ended([first]))

        warm.start_run()
        (second,) = warm.rollout_workers(_cfg(world, "second"), [1], options)
        now = ray.get(second.identity.remote())
        assert now == {"run": "second", "worker": 1, "pid": before["pid"]}  # the same process
        os.kill(now["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 120
        while True:  # Ray restarts it with its creation arguments: run "first", worker 0
            try:
                again = ray.get(second.identity.remote(), timeout=30)
                break
            except ray.exceptions.RayActorError:
                assert time.monotonic() < deadline
                time.sleep(0.5)
        assert again["pid"] != now["pid"]
        assert (again["run"], again["worker"]) == ("second", 1)  # read from the board
    finally:
        warm.close()


def test_kept_learner_ranks_go_to_a_group_of_their_size_only(ray_local, world):
    warm = WarmActors()
    options = {"num_cpus": 1}
    try:
        warm.start_run()
        one = _load(world, "one")
        assert warm.learner_group(one, options) is None  # none kept
        group, ended = _group(one, options)
        gone = ray.get(group.ranks[0].placement.remote())
        warm.keep(ended)

        warm.start_run()  # a group of two takes none of them; the kept rank is stopped
        assert warm.learner_group(_load(world, "two", "train.learner.count=2"), options) is None
        warm.release_unused()
        deadline = (
            time.monotonic() + 60
        )  # ray.kill is asynchronous: a call sent at once may still land
        with pytest.raises(ray.exceptions.RayActorError):
            while time.monotonic() < deadline:
                ray.get(group.ranks[0].placement.remote(), timeout=60)
                time.sleep(0.2)

        warm.start_run()  # kept again by a run of one: the same process, reconfigured
        group, ended = _group(one, options)
        first = ray.get(group.ranks[0].placement.remote())
        warm.keep(ended)
        warm.start_run()
        again, pg = warm.learner_group(_load(world, "again"), options)
        assert pg is ended.learner_pg  # its placement group with it
        (rank,) = again.ranks
        assert ray.get(rank.placement.remote())["pid"] == first["pid"]
        assert gone["pid"] != first["pid"]
        warm.keep(_Ended(learner=again, learner_pg=pg))
    finally:
        warm.close()


def test_a_kept_group_another_run_did_not_take_stays_while_there_is_room(ray_local, world):
    """A group of one kept while a run of two goes by (the cluster has room for the
    two beside it) is taken by the next run of one: the same process. Asked for more
    than the cluster has free, the pool stops it."""
    from g2rpo.orchestration.placement import ray_resources

    warm = WarmActors()
    options = {"num_cpus": 1}
    assert ray_resources([options, options, {"num_cpus": 0.5, "resources": {"x": 1}}]) == {
        "CPU": 2.5,
        "x": 1,
    }
    try:
        warm.start_run()
        one = _load(world, "one")
        group, ended = _group(one, options)
        first = ray.get(group.ranks[0].placement.remote())
        warm.keep(ended)

        warm.start_run()  # a run of two: its ranks are new, and there is room beside
        assert warm.learner_group(_load(world, "two", "train.learner.count=2"), options) is None
        warm.release_unused(needed=ray_resources([options, options]))
        assert warm.holds_unused()

        warm.start_run()
        again, pg = warm.learner_group(_load(world, "one-again"), options)
        (rank,) = again.ranks
        assert ray.get(rank.placement.remote())["pid"] == first["pid"]  # kept all along
        warm.keep(_Ended(learner=again, learner_pg=pg))

        warm.start_run()  # more than the whole cluster has free: stopped
        warm.release_unused(needed={"CPU": ray.cluster_resources()["CPU"] + 1})
        assert not warm.holds_unused()
        deadline = time.monotonic() + 60  # ray.kill is asynchronous
        with pytest.raises(ray.exceptions.RayActorError):
            while time.monotonic() < deadline:
                ray.get(rank.placement.remote(), timeout=60)
                time.sleep(0.2)
    finally:
        warm.close()


def test_train_env_vars_reach_every_kind_of_actor(ray_local, world):
    """train.env_vars (NCCL_SOCKET_IFNAME and the like) are in each actor's environment:
    the driver's shell reaches none of them on a cluster. Every kind's options carry them
    as its runtime environment, and an actor started with those options sees them (a
    reward replica: the lightest actor; a worker or learner would load the world first)."""
    from g2rpo.reward_server.replica_actor import RewardReplica

    cfg = _load(world, "env", "train.env_vars={G2RPO_TEST_IFNAME: eth7}")
    t = cfg.train
    kinds = [*t.actor_kinds().values(), t.reward]
    assert len(kinds) == 4  # workers, learner ranks, the evaluator, reward replicas
    for kind in kinds:
        assert t.ray_options(kind)["runtime_env"] == {"env_vars": {"G2RPO_TEST_IFNAME": "eth7"}}
    replica = RewardReplica.options(**t.ray_options(t.reward)).remote(
        "shapes_oracle", "tok", None, "cpu"
    )
    try:
        seen = ray.get(
            replica.__ray_call__.remote(lambda self: os.environ.get("G2RPO_TEST_IFNAME")),
            timeout=120,
        )
        assert seen == "eth7"
        assert os.environ.get("G2RPO_TEST_IFNAME") is None  # the driver's own is untouched
    finally:
        ray.kill(replica, no_restart=True)


def test_a_version_too_big_for_the_object_stores_is_said_once(ray_local):
    """The session's local Ray has 256 MiB object stores: a 25.8 KiB version fits, a
    200 MiB one (two of them in flight) would spill at every publish, which the driver
    says with the ray start flag that fixes it."""
    from g2rpo.orchestration.placement import object_store_too_small

    assert object_store_too_small(26_000) is None
    line = object_store_too_small(200 * 2**20)
    assert line is not None and "--object-store-memory=" in line and "0.2 GiB" in line
