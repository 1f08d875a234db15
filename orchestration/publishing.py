"""Publishing a weight version to the rollout workers, by ``train.weights.transport``:

* ``object_store``: learner rank 0 puts the version once into Ray's object store
  and every worker fetches it;
* ``collective``: learner rank 0 broadcasts it over a process group of its own with
  the workers (``weight_sync``; NCCL between GPUs, gloo on CPU). The group is formed
  on first use and again whenever a worker was restarted; a broadcast that fails
  (a worker died in it) falls back to the object store for that version.

* colocated pairs (``train.placement: colocated``): learner rank i hands the version to
  rollout worker i inside their GPU (``common/wire/ipc_handoff.py``: buckets of device memory
  the worker maps through CUDA IPC handles, and copies into its transformer), every rank
  gathering it; none of its bytes pass through host memory or the object store. A pair
  that cannot (the worker on another device, restarted without its pipeline, failed in
  the handoff; a LoRA run) loads from the object store, into which the group then puts
  the version once (``IpcPublished.object_ref``).

Either way every worker verifies the version and checksum it loaded, and a worker
that dies or is stuck past ``train.workers.rollout_timeout_s`` is restarted by Ray and loads
the version from the object store. The evaluator always loads from the object store
(off the critical path, and only when it evaluates)."""

from __future__ import annotations

import sys
import uuid

import ray

from ..common.wire.messages import PublishedWeights, WeightsLoaded
from .cluster import RunActors, get_or_redo


class Published:
    """A version the learner published, as the driver holds it: what an actor needs
    to load it, and what pushing it cost. The object ref of a broadcast version is
    made only when an actor outside the broadcast (the evaluator, a restarted worker)
    needs it."""

    def __init__(self, weights: PublishedWeights, learner=None) -> None:
        self.version, self.checksum, self.nbytes = weights.version, weights.checksum, weights.nbytes
        self._ref, self._learner = weights.ref, learner
        self.via = "object_store" if weights.ref is not None else "collective"  # how workers got it
        # seconds of work: rank 0 producing the version, then the slowest worker's
        # fetch/receive, verification and load (not a wait for a rollout in progress)
        self.push_s = weights.seconds

    def object_ref(self):
        if self._ref is None:
            (self._ref,) = ray.get(self._learner.rank0.put_weights.remote(self.version))
        return self._ref

    def load_on(self, actor):
        return actor.load_weights.remote(self.version, self.object_ref(), self.checksum)

    def held_by(self, got: WeightsLoaded) -> bool:
        """``got`` (a worker's answer) holds this version, as it was sent to it."""
        return got.holds(self.version, self.checksum)

    def loaded_by_all(self, answers: list[WeightsLoaded]) -> None:
        """Each worker's answer checked; the slowest load added to ``push_s``."""
        for worker, answer in enumerate(answers):
            check_loaded(worker, answer, self)
        self.push_s += max((a.seconds for a in answers), default=0.0)


def load_everywhere(
    weights: Published, workers: list, timeout: float | None, restart_s: float
) -> None:
    """Every worker loads ``weights`` from the object store and says which version
    and checksum it holds; a stuck one is killed, and a dead one is restarted by Ray
    and loads it then."""
    pending = [weights.load_on(w) for w in workers]
    answers = [
        get_or_redo(ref, weights.load_on, workers[i], timeout, restart_s)
        for i, ref in enumerate(pending)
    ]
    weights.loaded_by_all(answers)


def check_loaded(worker: int, got: WeightsLoaded, weights: Published) -> None:
    if not weights.held_by(got):
        raise RuntimeError(
            f"worker {worker} loaded v{got.version} ({got.checksum}), "
            f"expected v{weights.version} ({weights.checksum})"
        )


class ObjectStorePublisher:
    def __init__(self, actors: RunActors, timeout: float | None, restart_s: float) -> None:
        self.actors, self.timeout, self.restart_s = actors, timeout, restart_s

    def publish(self) -> Published:
        weights = Published(self.actors.learner.publish())
        load_everywhere(weights, self.actors.workers, self.timeout, self.restart_s)
        return weights

    def counters(self) -> dict:
        return {}


class BroadcastFailed(RuntimeError):
    """A worker did not take the broadcast version."""


class CollectivePublisher:
    def __init__(self, actors: RunActors, timeout: float | None, restart_s: float) -> None:
        # ``timeout`` (train.workers.rollout_timeout_s) bounds a whole publish, as on the
        # object-store path; a dead peer inside a collective is caught sooner, by the
        # group's own per-operation timeout (train.collective_timeout_s)
        self.actors, self.timeout, self.restart_s = actors, timeout, restart_s
        self.name: str | None = None  # the group every member holds; None: form one
        self.formed = 0  # groups formed: the first, then one after each restart or failure
        self.failures = 0  # broadcasts that failed (those versions went by object store)

    def publish(self) -> Published:
        learner = self.actors.learner
        staged = learner.stage_weights()
        weights, layout, version = Published(staged, learner=learner), staged.layout, staged.version
        try:
            members = self._members()  # also waits until every worker is idle
            if self.name is None or members != [self.name] * len(members):
                self._form()
            self._broadcast(weights, layout)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError, BroadcastFailed) as exc:
            print(
                f"weight broadcast of v{version} failed ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200]}); loading it from the object store, "
                "and forming the group again before the next version",
                file=sys.stderr,
            )
            self.name = None
            self.failures += 1
            weights.via = "object_store"
            load_everywhere(weights, self.actors.workers, self.timeout, self.restart_s)
        return weights

    def counters(self) -> dict:
        """For each iteration's row: groups formed, broadcasts that failed."""
        return {"weight_groups_formed": self.formed, "weight_broadcast_failures": self.failures}

    def _members(self) -> list:
        """The group each worker holds (None after a restart), once it is idle; a
        worker stuck past the rollout timeout is killed and restarted."""

        def ask(actor):
            return actor.weight_group.remote()

        workers = self.actors.workers
        pending = [ask(w) for w in workers]
        return [
            get_or_redo(ref, ask, w, self.timeout, self.restart_s)
            for ref, w in zip(pending, workers, strict=True)
        ]

    def _form(self) -> None:
        rank0, workers = self.actors.learner.rank0, self.actors.workers
        name = uuid.uuid4().hex[:12]
        address = ray.get(rank0.meeting_address.remote())
        world = len(workers) + 1
        refs = [rank0.join_weight_group.remote(name, address, 0, world)]
        refs += [
            w.join_weight_group.remote(name, address, i + 1, world) for i, w in enumerate(workers)
        ]
        ray.get(refs, timeout=self.timeout)
        self.name = name
        self.formed += 1

    def _broadcast(self, weights: Published, layout) -> None:
        rank0, workers = self.actors.learner.rank0, self.actors.workers
        send = rank0.broadcast_weights.remote(self.name, weights.version)
        loads = [
            w.receive_weights.remote(self.name, weights.version, layout, weights.checksum)
            for w in workers
        ]
        got = ray.get([*loads, send], timeout=self.timeout)
        answers = got[:-1]
        for i, answer in enumerate(answers):
            if not answer.holds(weights.version, weights.checksum):
                raise BroadcastFailed(f"worker {i} holds v{answer.version} after the broadcast")
        weights.loaded_by_all(answers)


class IpcPublished(Published):
    """A version handed over inside the pairs' GPUs (``weights.checksum``: its device
    checksum). Its object-store copy is made only when an actor outside the handoff needs
    it (the evaluator, a worker restarted during the rollout): the learner group puts its
    current weights, still this version (colocated runs never overlap an update with a
    rollout), and a worker loading that copy answers with its XXH3 checksum."""

    def __init__(self, weights: PublishedWeights, group) -> None:
        super().__init__(weights)
        self.via, self._group = "ipc", group
        self.store_checksum: str | None = None

    def object_ref(self):
        if self._ref is None:
            stored = self._group.put_version(self.version)
            self._ref, self.store_checksum = stored.ref, stored.checksum
        return self._ref

    def load_on(self, actor):
        ref = self.object_ref()
        return actor.load_weights.remote(self.version, ref, self.store_checksum)

    def held_by(self, got: WeightsLoaded) -> bool:
        return got.version == self.version and got.checksum in (self.checksum, self.store_checksum)


class IpcPublisher:
    """``train.placement: colocated``: each learner rank hands the version to its own
    worker inside their GPU; the workers it could not reach load it from the object store."""

    def __init__(self, actors: RunActors, timeout: float | None, restart_s: float) -> None:
        self.actors, self.timeout, self.restart_s = actors, timeout, restart_s
        self.fallbacks = 0  # worker loads that went by the object store instead
        self.host_bytes = 0  # the last handoff's bytes between the processes (all pairs)

    def publish(self) -> Published:
        workers, group = self.actors.workers, self.actors.learner
        results = group.handoff(workers, self._peers())
        first = results[0]
        seconds = max(r.seconds for r in results)
        published = PublishedWeights(first.version, first.checksum, first.nbytes, seconds)
        weights = IpcPublished(published, group)
        self.host_bytes = sum(r.host_bytes for r in results)
        answers, missed = {}, []
        for i, r in enumerate(results):
            if r.version != first.version or r.checksum != first.checksum:
                raise RuntimeError(
                    f"learner rank {i} gathered v{r.version} ({r.checksum}), rank 0 "
                    f"v{first.version} ({first.checksum}): the ranks disagree on the weights"
                )
            if r.loaded is None:
                missed.append(i)
                print(
                    f"weights v{first.version}: rollout worker {i} loads from the object store "
                    f"({r.reason})",
                    file=sys.stderr,
                )
            else:
                answers[i] = r.loaded
        for i in missed:  # a dead or stuck one is restarted by Ray and loads then
            ref = weights.load_on(workers[i])
            answers[i] = get_or_redo(ref, weights.load_on, workers[i], self.timeout, self.restart_s)
        self.fallbacks += len(missed)
        for i, answer in sorted(answers.items()):
            check_loaded(i, answer, weights)
        # the ranks handed over side by side: the slowest pair's wait, then the fallbacks'
        weights.push_s += max((answers[i].seconds for i in missed), default=0.0)
        return weights

    def _peers(self) -> list:
        """Each worker's ``handoff_peer()``, None for one that does not answer in time
        (dead or restarting: it loads from the object store)."""
        refs = [w.handoff_peer.remote() for w in self.actors.workers]
        peers = []
        for ref in refs:
            try:
                peers.append(ray.get(ref, timeout=self.timeout))
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
                peers.append(None)
        return peers

    def counters(self) -> dict:
        """For each iteration's row: worker loads that went by the object store instead
        (all so far), and the last handoff's bytes between the processes (handles and
        layouts: none of the version's)."""
        return {
            "weight_handoff_fallbacks": self.fallbacks,
            "weight_handoff_host_bytes": self.host_bytes,
        }


def publisher_for(actors: RunActors, cfg):
    from ..common.cluster.timeouts import worker_start_timeout_s

    t, restart_s = cfg.train, worker_start_timeout_s(cfg)
    if t.placement == "colocated" and cfg.model.lora is None:
        return IpcPublisher(actors, t.workers.rollout_timeout_s, restart_s)
    if t.weights.transport == "collective":
        return CollectivePublisher(actors, t.workers.rollout_timeout_s, restart_s)
    return ObjectStorePublisher(actors, t.workers.rollout_timeout_s, restart_s)
