"""The learner Ray actor (one rank of the learner group): a thin shell around
``LearnerCore``."""

from __future__ import annotations

import time

import ray

from ..common.config.run import G2RPOConfig
from ..common.wire.ipc_handoff import HandoffResult
from ..common.wire.messages import PublishedWeights
from ..common.wire.weight_sync import WeightGroupMember, layout_of
from ..common.wire.weights import publishable, state_nbytes


@ray.remote(max_restarts=0)
class Learner(WeightGroupMember):
    """One rank of the learner group: fuses advantages, updates its share of the
    policy, and (rank 0) publishes (version, weights) once. A group calls every
    method on every rank: the ranks gather and reduce together."""

    def __init__(self, cfg: dict, rank: int = 0, world: int = 1) -> None:
        self._configure(cfg, rank, world)

    def _configure(self, cfg: dict, rank: int, world: int) -> None:
        self.cfg, self._core = G2RPOConfig.model_validate(cfg), None
        self.rank, self.world = rank, world
        self._transformer = None  # read by prepare(), before the group forms
        from .staged_versions import StagedVersions, versions_kept

        # rank 0, collective transport: the versions a worker may still load
        self._staged = StagedVersions(versions_kept(self.cfg.train.weights.staleness))

    def reconfigure(self, cfg: dict, rank: int, world: int) -> None:
        """Become rank ``rank`` of another run's group (a warm actor taken again): out
        of every group, the model built again on first use (modules already imported)."""
        from .distributed import leave_learner_group

        self.leave_weight_group()
        leave_learner_group()
        self._configure(cfg, rank, world)

    @property
    def core(self):
        if self._core is None:  # loaded on first use, as the rollout workers
            from .trainer import LearnerCore, learner_share

            share = learner_share(self.cfg, self.rank)
            transformer, self._transformer = self._transformer, None  # the core's now
            self._core = LearnerCore(self.cfg, share, transformer)
        return self._core

    def prepare(self) -> None:
        """Read this rank's transformer before the group forms (a sharded group's
        rank 0: the whole of it, on the CPU; the other ranks: its shape, on the meta
        device). ``ready()`` then shards it at once, so no rank waits for rank 0's
        read inside a collective, whose timeout a slow read on shared storage would
        overrun: the driver waits for it here, in Ray (``LearnerGroup.form``)."""
        from .trainer import learner_share, read_transformer

        if self._core is None and self._transformer is None:
            self._transformer = read_transformer(self.cfg, learner_share(self.cfg, self.rank))

    def meeting_address(self) -> str:
        """Rank 0: host:port where a group meets (the learner group, the weight
        group): a free port on this node."""
        from ..common.cluster.net import free_address

        return free_address()

    def join(self, address: str) -> None:
        from ..common.cluster.timeouts import collective_timeout_s
        from .distributed import join_learner_group

        timeout = collective_timeout_s(self.cfg)  # scaled by what this node reads
        # checkpoints: each rank writes about two float32 copies of its share, and
        # waits in the checkpoint group for the slowest writer
        join_learner_group(address, self.rank, self.world, self.cfg.model.device, timeout, timeout)

    def ready(self) -> bool:
        return self.core is not None

    def publish(self) -> PublishedWeights | None:
        """Rank 0: the current version put once into the object store; other ranks
        None (they take part in gathering sharded weights)."""
        t0 = time.perf_counter()
        published = self.core.weights()
        if published is None:
            self._step_aside()
            return None
        version, state, checksum = published
        nbytes = state_nbytes(state)
        # one object per version, shared by all workers (a LoRA run: the adapters only):
        # NumPy arrays, which each worker maps from its node's copy (shared_tensors.py)
        ref = ray.put(publishable(state))
        # the gathered host copy goes before this rank's state moves to the host beside it
        del published, state
        self._step_aside()
        seconds = time.perf_counter() - t0
        return PublishedWeights(version, checksum, nbytes, seconds, ref=ref)

    # -- train.placement colocated: the version handed to this rank's worker in the GPU

    def device_identity(self) -> str | None:
        """What this rank's worker compares to know they share a device (ipc_handoff)."""
        from ..common.wire.ipc_handoff import device_identity

        return device_identity(self.cfg.model.device)

    def handoff(self, worker, peer: dict | None) -> HandoffResult:
        """Every rank: gather the current version on this rank's device and hand it to
        ``worker`` (this rank's pair) as buckets of device memory, each freed for the next
        only after the worker copied it out (``common/wire/ipc_handoff.py``); then step aside.
        ``peer``: the worker's ``handoff_peer()`` (None: it did not answer). A rank whose
        worker is on another device, has no pipeline loaded yet (restarted) or fails
        during the handoff still gathers every tensor (the group's collectives need
        every rank) and says why in ``reason``: the driver loads that worker from the
        object store."""
        from dataclasses import replace

        from ..common.cluster.timeouts import collective_timeout_s
        from .handoff import hand_over

        reason = self._cannot_hand_over(peer)
        deliver = finish = None
        if reason is None:
            timeout = collective_timeout_s(self.cfg)

            def deliver(message, _bucket):  # (the bucket itself stays here)
                return ray.get(worker.take_bucket.remote(message), timeout=timeout)

            def finish(checksum: str):
                version = self.core.version
                return ray.get(worker.finish_handoff.remote(version, checksum), timeout=timeout)

        result, error = hand_over(self.core, deliver, finish)
        self._step_aside()
        if error is not None:
            reason = f"the handoff failed: {type(error).__name__}: {str(error)[:300]}"
        return replace(result, reason=reason)

    def _cannot_hand_over(self, peer: dict | None) -> str | None:
        if self.cfg.model.lora is not None:
            return "a LoRA run's adapters go by the object store"
        if peer is None:
            return "the worker did not answer (restarting)"
        if not peer.get("built"):
            return "the worker has no pipeline loaded (restarted)"
        mine = self.device_identity()
        if mine is None or peer.get("device") != mine:
            return f"the worker is on device {peer.get('device')}, this rank on {mine}"
        return None

    def put_version(self, version: int) -> PublishedWeights | None:
        """Every rank: version ``version`` (the current one) put into the object store by
        rank 0, for what the handoff does not reach (the evaluator, a worker restarted
        during the rollout): gathered again on the host, as ``publish`` does."""
        if self.core.version != version:
            raise RuntimeError(
                f"learner rank {self.rank} holds v{self.core.version}: v{version} was handed "
                "over inside the GPUs only and is gone (train.placement colocated)"
            )
        return self.publish()

    def _step_aside(self) -> None:
        """Colocated (train.placement): once a version is published the rollout has the
        GPU this rank shares with its worker, so the core's state goes to the host until
        the next update."""
        if self.cfg.train.placement == "colocated":
            self.core.offload()

    def placement(self) -> dict:
        from ..common.cluster.placement import where_am_i

        return where_am_i()

    # -- train.weights.transport: collective (rank 0 of the broadcast group)
    def stage_weights(self) -> PublishedWeights | None:
        """Every rank takes part (gathering); rank 0 keeps the version for the
        broadcast (and an object-store fallback) and returns its layout; other ranks
        None."""
        t0 = time.perf_counter()
        published = self.core.weights()
        if published is None:
            return None
        version, state, checksum = published
        self._staged.add(version, state)
        layout = layout_of(state)
        seconds = time.perf_counter() - t0
        return PublishedWeights(version, checksum, layout.nbytes, seconds, layout=layout)

    def put_weights(self, version: int) -> list:
        return [self._staged.object_ref(version)]

    def broadcast_weights(self, name: str, version: int) -> None:
        if self._weights is None or self._weights.name != name:
            raise RuntimeError(f"learner rank 0 is not in weight group {name}")
        state = self._staged.state(version)
        self._weights.send(state, layout_of(state))

    def export(self, directory: str) -> str | None:
        return self.core.export(directory)

    def update(self, *batches):
        return self.core.update(list(batches))

    def iteration(self) -> int:
        return self.core.iteration

    def save(self, path: str) -> None:
        self.core.save(path)

    def load(self, path: str) -> int:
        return self.core.load(path)
