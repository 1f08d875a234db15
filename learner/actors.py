"""Thin Ray actors around the pure worker and learner cores."""

from __future__ import annotations

import ray

from ..common.config import G2RPOConfig


class WeightGroupMember:
    """Membership of the weight-broadcast group (``train.weights.transport:
    collective``): learner rank 0 and every rollout worker. A restarted actor holds
    none, which is how the driver knows to form the group again."""

    cfg: G2RPOConfig
    _weights = None

    def weight_group(self) -> str | None:
        return None if self._weights is None else self._weights.name

    def join_weight_group(self, name: str, address: str, rank: int, world: int) -> None:
        from .weight_sync import WeightGroup

        self.leave_weight_group()
        t, device = self.cfg.train, self.cfg.model.device
        self._weights = WeightGroup(name, address, rank, world, device, t.collective_timeout_s)

    def leave_weight_group(self) -> None:
        if self._weights is not None:
            self._weights.close()
            self._weights = None


@ray.remote(max_restarts=-1, max_task_retries=0)
class RolloutWorker(WeightGroupMember):
    """Holds a pipeline; loads published weights; rolls out its share of prompts."""

    def __init__(self, cfg: dict, worker: int) -> None:
        # the pipeline loads on first use, so placement() answers as soon as Ray has
        # placed the actor, and a restarted actor reloads it by itself
        self.cfg, self.worker, self._core = G2RPOConfig.model_validate(cfg), worker, None

    @property
    def core(self):
        if self._core is None:
            from ..rollout_worker.worker import RolloutWorkerCore

            self._core = RolloutWorkerCore(self.cfg, self.worker)
        return self._core

    def ready(self) -> bool:
        return self.core is not None

    def load_weights(self, version: int, state: dict, checksum: str) -> tuple[int, str]:
        return self.core.load_weights(version, state, checksum)

    # -- train.weights.transport: collective (rank worker+1 of the broadcast group)

    def receive_weights(self, name: str, version: int, layout, checksum: str):
        """Take a broadcast version (verified and loaded as from the object store)."""
        if self.weight_group() != name:
            raise RuntimeError(f"worker {self.worker} is not in weight group {name}")
        # receive before touching the core: a restarted worker loads its pipeline
        # after the broadcast, not while the group waits for it
        state = self._weights.receive(layout)
        return self.core.load_weights(version, state, checksum)

    def loaded(self) -> tuple[int, str | None]:
        return self.core.version, self.core.checksum

    def rollout(
        self, iteration: int, prompts: list[str], urls: list[str], redis_url, token, scorers
    ):
        return self.core.rollout(iteration, prompts, urls, redis_url, token, scorers)

    def evaluate(self, prompts: list[str], seed: int, urls: list[str], redis_url, token, scorers):
        return self.core.evaluate(prompts, seed, urls, redis_url, token, scorers)

    def pid(self) -> int:
        import os

        return os.getpid()

    def placement(self) -> dict:
        from .placement import where_am_i

        return where_am_i()


@ray.remote(max_restarts=0)
class Learner(WeightGroupMember):
    """One rank of the learner group: fuses advantages, updates its share of the
    policy, and (rank 0) publishes (version, weights) once. A group calls every
    method on every rank: the ranks gather and reduce together."""

    def __init__(self, cfg: dict, rank: int = 0, world: int = 1) -> None:
        self.cfg, self._core = G2RPOConfig.model_validate(cfg), None
        self.rank, self.world = rank, world
        from .publishing import StagedVersions, versions_kept

        # rank 0, collective transport: the versions a worker may still load
        self._staged = StagedVersions(versions_kept(self.cfg.train.weights.staleness))

    @property
    def core(self):
        if self._core is None:  # loaded on first use, as the rollout workers
            from .trainer import LearnerCore, learner_share

            self._core = LearnerCore(self.cfg, learner_share(self.cfg, self.rank))
        return self._core

    def meeting_address(self) -> str:
        """Rank 0: host:port where a group meets (the learner group, the weight
        group): a free port on this node."""
        from .placement import free_address

        return free_address()

    def join(self, address: str) -> None:
        from .distributed import join_learner_group

        t = self.cfg.train
        join_learner_group(
            address, self.rank, self.world, self.cfg.model.device, t.collective_timeout_s
        )

    def ready(self) -> bool:
        return self.core is not None

    def publish(self):
        """Rank 0: (version, [object ref], checksum, bytes); other ranks None (they
        take part in gathering sharded weights)."""
        published = self.core.weights()
        if published is None:
            return None
        version, state, checksum = published
        from ..common.weights import state_nbytes

        # one object per version, shared by all workers (a LoRA run: the adapters only)
        return version, [ray.put(state)], checksum, state_nbytes(state)

    def placement(self) -> dict:
        from .placement import where_am_i

        return where_am_i()

    # -- train.weights.transport: collective (rank 0 of the broadcast group)
    def stage_weights(self):
        """Every rank takes part (gathering); rank 0 keeps the version for the
        broadcast (and an object-store fallback) and returns (version, layout,
        checksum, bytes); other ranks None."""
        from .weight_sync import layout_of

        published = self.core.weights()
        if published is None:
            return None
        version, state, checksum = published
        self._staged.add(version, state)
        layout = layout_of(state)
        return version, layout, checksum, layout.nbytes

    def put_weights(self, version: int) -> list:
        return [self._staged.object_ref(version)]

    def broadcast_weights(self, name: str, version: int) -> None:
        if self._weights is None or self._weights.name != name:
            raise RuntimeError(f"learner rank 0 is not in weight group {name}")
        from .weight_sync import layout_of

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
