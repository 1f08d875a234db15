"""Colocated publishing (orchestration/publishing.IpcPublisher) on real Ray actors: a
2-rank learner group of the committed world (FSDP2 over gloo: every rank gathers every
tensor) hands each of its 2 rollout workers the version through shared memory, rank i to
worker i, with none of the version's bytes in Ray's object store; a worker Ray restarted
(no pipeline loaded yet) loads it from the object store instead. On 3bb9114 a colocated
version always went through the object store (and there was no IpcPublisher)."""

import os
import signal

import pytest
import ray
import torch
from g2rpo.common.config.loading import load_config
from g2rpo.common.wire.ipc_handoff import digest_hex, digest_sums
from g2rpo.common.wire.shared_tensors import from_wire
from g2rpo.common.wire.weights import publishable, weights_checksum
from g2rpo.orchestration.cluster import RunActors
from g2rpo.orchestration.publishing import IpcPublisher, publisher_for
from small_run import SMALL_RUN, formed_learner_and_workers
from test_ipc_handoff import store_bytes_created

# a Ray cluster and a learner group: `pytest -m 'not slow'` leaves it out
pytestmark = pytest.mark.slow


def _holds(actors: RunActors) -> list:
    return [tuple(ray.get(w.loaded.remote())) for w in actors.workers]


def test_pairs_take_the_version_in_the_device_and_a_restarted_worker_from_the_store(
    ray_local, warm, world
):
    cfg = load_config(
        None,
        [
            *SMALL_RUN,
            f"model.pretrained={world / 'pipeline'}",
            "train.learner.count=2",
            "train.placement=colocated",
        ],
    )
    with formed_learner_and_workers(warm, cfg) as actors:
        publisher = publisher_for(actors, cfg)
        assert isinstance(publisher, IpcPublisher)
        # the workers start from other weights than the learner's (so a handoff that
        # copied nothing could not pass): the pretrained ones + 0.5, from the store
        start = actors.learner.put_version(0)  # (a fresh group holds version 0)
        other = {
            k: v + 0.5 if v.is_floating_point() else v
            for k, v in from_wire(ray.get(start.ref)).items()
        }
        ref = ray.put(publishable(other))
        ray.get([w.load_weights.remote(-1, ref, weights_checksum(other)) for w in actors.workers])

        before = store_bytes_created()
        first = publisher.publish()
        assert store_bytes_created() - before == 0  # nothing of it in the object store
        assert first.via == "ipc" and publisher.fallbacks == 0
        assert _holds(actors) == [(first.version, first.checksum)] * 2
        assert 0 < publisher.host_bytes < first.nbytes / 100  # handles and layouts only
        # the checksum both workers matched is of the learner's own weights: computed
        # again here from the copy the group puts into the store when asked
        before = store_bytes_created()
        stored = from_wire(ray.get(first.object_ref()))
        assert store_bytes_created() - before >= first.nbytes  # (the counter counts a put)
        assert digest_hex(list(stored.items()), digest_sums(list(stored.values()))) == (
            first.checksum
        )
        assert not any(torch.equal(stored[k], other[k]) for k in stored if "weight" in k)

        pid = ray.get(actors.workers[1].pid.remote())
        os.kill(pid, signal.SIGKILL)  # Ray restarts it; it has no pipeline until used
        second = publisher.publish()
        assert second.via == "ipc" and publisher.fallbacks == 1
        assert ray.get(actors.workers[1].pid.remote()) != pid
        assert _holds(actors) == [
            (second.version, second.checksum),
            (second.version, second.store_checksum),  # from the object store
        ]
