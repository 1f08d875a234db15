"""Weight publishing by broadcast (train.weights.transport: collective) on real Ray
actors: a learner and 2 rollout workers of the committed world. A worker that dies
after the group formed and before the broadcast fails that broadcast; the version
then reaches every worker (the restarted one too) through the object store, and
the next version is broadcast over a group formed again."""

import os
import signal
import time

import pytest
import ray
from g2rpo.common.config.loading import load_config
from g2rpo.orchestration.cluster import RunActors
from g2rpo.orchestration.publishing import CollectivePublisher
from small_run import SMALL_RUN, formed_learner_and_workers

# a training run, a Ray cluster or a service: `pytest -m 'not slow'` leaves it out
pytestmark = pytest.mark.slow


class DeathBeforeBroadcast(CollectivePublisher):
    """Kills worker 1 once, after the group is formed and before the broadcast."""

    victim: int | None = None

    def _broadcast(self, weights, layout):
        if self.victim is None:
            self.victim = ray.get(self.actors.workers[1].pid.remote())
            os.kill(self.victim, signal.SIGKILL)
            time.sleep(0.5)
        return super()._broadcast(weights, layout)


def _holds(actors: RunActors) -> list:
    return [tuple(ray.get(w.loaded.remote())) for w in actors.workers]


def test_a_failed_broadcast_falls_back_and_the_group_is_formed_again(ray_local, warm, world):
    """The learner and workers are the session's kept ones where it has them (as a run
    takes them), given back when the test passes."""
    cfg = load_config(
        None,
        [
            *SMALL_RUN,
            f"model.pretrained={world / 'pipeline'}",
            "train.weights.transport=collective",
            "train.collective_timeout_s=10",
        ],
    )
    with formed_learner_and_workers(warm, cfg) as actors:
        publisher = DeathBeforeBroadcast(actors, timeout=120, restart_s=300)

        first = publisher.publish()
        assert first.via == "object_store"  # the broadcast failed: the fallback took it
        assert publisher.failures == 1 and publisher.formed == 1 and publisher.name is None
        assert _holds(actors) == [(first.version, first.checksum)] * 2
        assert ray.get(actors.workers[1].pid.remote()) != publisher.victim  # restarted

        second = publisher.publish()  # a new group, with the restarted worker in it
        assert second.via == "collective"
        assert publisher.formed == 2 and publisher.failures == 1
        names = ray.get([w.weight_group.remote() for w in actors.workers])
        assert names == [publisher.name] * 2
        assert _holds(actors) == [(second.version, second.checksum)] * 2


def test_rank0_keeps_the_versions_a_worker_may_load_each_held_once(ray_local):
    """Overlapped iterations keep the newest version and the one the rollout in flight
    started with; putting a version for an actor outside the broadcast keeps only the
    object-store copy, and asking again gives the same object."""
    import gc
    import weakref

    import torch
    from g2rpo.common.wire.weights import weights_checksum
    from g2rpo.learner.staged_versions import StagedVersions, versions_kept

    assert (versions_kept(0), versions_kept(1), versions_kept(3)) == (1, 2, 2)
    staged = StagedVersions(versions_kept(1))
    for v in (1, 2, 3):
        staged.add(v, {"w": torch.full((8, 8), float(v))})
    assert staged.versions() == [2, 3]
    want = {v: weights_checksum({"w": torch.full((8, 8), float(v))}) for v in (2, 3)}
    tensors = weakref.ref(staged.state(2)["w"])
    ref = staged.object_ref(2)
    assert staged.object_ref(2) == ref  # one put per version
    gc.collect()
    assert tensors() is None  # once put, the object-store copy is the only one
    for v in (2, 3):  # from the object store or as staged, the same weights
        assert weights_checksum(staged.state(v)) == want[v]
    assert weights_checksum(ray.get(ref)) == want[2]
    staged.add(4, {"w": torch.zeros(1)})
    assert staged.versions() == [3, 4]
