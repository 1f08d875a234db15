"""The rollout worker Ray actor: a thin shell around ``RolloutWorkerCore``."""

from __future__ import annotations

import time
from dataclasses import replace

import ray

from ..common.config.run import G2RPOConfig
from ..common.wire.messages import EvalSamples, RewardEndpoints, WeightsLoaded
from ..common.wire.weight_sync import WeightGroupMember


@ray.remote(max_restarts=-1, max_task_retries=0)
class RolloutWorker(WeightGroupMember):
    """Holds a pipeline; loads published weights; rolls out its share of prompts."""

    def __init__(self, cfg: dict, worker: int, board: str | None = None, slot: str = "") -> None:
        if board is not None:
            # kept warm between runs (orchestration/warm_actors.py): Ray restarts an
            # actor with the arguments it was created with, an earlier run's config;
            # the named board holds what the current run set for this slot
            cfg, worker = ray.get(ray.get_actor(board).get.remote(slot))
        self._configure(cfg, worker)

    def _configure(self, cfg: dict, worker: int) -> None:
        # the pipeline loads on first use, so placement() answers as soon as Ray has
        # placed the actor, and a restarted actor reloads it by itself
        self.cfg, self.worker, self._core = G2RPOConfig.model_validate(cfg), worker, None

    def reconfigure(self, cfg: dict, worker: int) -> None:
        """Become worker ``worker`` of another run (a warm actor taken again): no
        weight group, the pipeline loaded again on first use (modules already imported)."""
        self.leave_weight_group()
        self._configure(cfg, worker)

    def identity(self) -> dict:
        """Which run and worker index this process serves."""
        import os

        return {"run": self.cfg.run.name, "worker": self.worker, "pid": os.getpid()}

    @property
    def core(self):
        if self._core is None:
            from .worker import RolloutWorkerCore

            self._core = RolloutWorkerCore(self.cfg, self.worker)
        return self._core

    def ready(self) -> bool:
        return self.core is not None

    def load_weights(self, version: int, state: dict, checksum: str) -> WeightsLoaded:
        """A version from the object store (the driver passes its reference; Ray
        resolves it before the call): read-only views of this node's one copy, which
        the core hashes and copies into its transformer (``load_published``); the views
        go when the call returns."""
        return self.core.load_weights(version, state, checksum)

    # -- train.weights.transport: collective (rank worker+1 of the broadcast group)

    def receive_weights(self, name: str, version: int, layout, checksum: str) -> WeightsLoaded:
        """Take a broadcast version (verified and loaded as from the object store)."""
        if self.weight_group() != name:
            raise RuntimeError(f"worker {self.worker} is not in weight group {name}")
        # receive before touching the core: a restarted worker loads its pipeline
        # after the broadcast, not while the group waits for it
        t0 = time.perf_counter()
        state = self._weights.receive(layout)
        received_s = time.perf_counter() - t0
        loaded = self.core.load_weights(version, state, checksum)
        return replace(loaded, seconds=received_s + loaded.seconds)

    # -- train.placement colocated: a version handed over inside the GPU by learner rank i

    def handoff_peer(self) -> dict:
        """What learner rank i checks before handing a version over inside the device:
        the device this worker sees (``ipc_handoff.device_identity``) and whether its
        pipeline is loaded (a restarted worker loads from the object store instead of
        keeping the learner group waiting while it loads)."""
        from ..common.wire.ipc_handoff import device_identity

        return {"device": device_identity(self.cfg.model.device), "built": self._core is not None}

    def take_bucket(self, message) -> int:
        """One bucket of the version (its handle, not its bytes): copied into the
        transformer on the device; returns once the learner may reuse the bucket."""
        return self.core.take_bucket(message)

    def finish_handoff(self, version: int, checksum: str) -> WeightsLoaded:
        return self.core.finish_handoff(version, checksum)

    def loaded(self) -> tuple[int, str | None]:
        return self.core.version, self.core.checksum

    @ray.method(num_returns=2)
    def rollout(self, iteration: int, prompts: list[str], rewards: RewardEndpoints):
        """(RolloutSummary, Trajectories) as two objects: the driver reads the summary,
        the learner ranks fetch the trajectories from this node by reference."""
        batch = self.core.rollout(iteration, prompts, rewards)  # (colocated: then steps aside)
        return batch.summary(), batch

    def evaluate(
        self,
        prompts: list[str],
        seed: int,
        rewards: RewardEndpoints,
        keep: list[int] | None = None,
        first: int = 0,
        total: int | None = None,
    ) -> EvalSamples:
        """Every sample's scores; of the images only those at ``keep`` (a sample grid's:
        400 held-out images of 720² are 593 MiB the driver has no use for). ``first``,
        ``total``: these are samples ``first``.. of an evaluation spread over workers."""
        samples = self.core.evaluate(prompts, seed, rewards, first, total)
        if keep is None:
            return samples
        return replace(samples, images=samples.images[keep])

    def pid(self) -> int:
        import os

        return os.getpid()

    def placement(self) -> dict:
        """Where it runs, and the SDPA kernels its rollout uses (with their timings when
        ``model.rollout_attention_backend: fastest`` measured them at the first call)."""
        from ..common.cluster.placement import where_am_i

        info = where_am_i()
        if self._core is not None:
            info.update(self._core.model.attention_record())
        return info
