"""Thin Ray actors around the pure worker and learner cores."""

from __future__ import annotations

import ray

from ..common.config import G2RPOConfig


@ray.remote(max_restarts=-1, max_task_retries=0)
class RolloutWorker:
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
class Learner:
    """Fuses advantages, updates the policy, publishes (version, weights) once."""

    def __init__(self, cfg: dict) -> None:
        self.cfg, self._core = G2RPOConfig.model_validate(cfg), None

    @property
    def core(self):
        if self._core is None:  # loaded on first use, as the rollout workers
            from .trainer import LearnerCore

            self._core = LearnerCore(self.cfg)
        return self._core

    def ready(self) -> bool:
        return self.core is not None

    def publish(self):
        version, state, checksum = self.core.weights()
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        # one object per version, shared by all workers (a LoRA run: the adapters only)
        return version, [ray.put(state)], checksum, nbytes

    def placement(self) -> dict:
        from .placement import where_am_i

        return where_am_i()

    def export(self, directory: str) -> str:
        return self.core.export(directory)

    def update(self, *batches):
        return self.core.update(list(batches))

    def iteration(self) -> int:
        return self.core.iteration

    def save(self, path: str) -> None:
        import torch

        torch.save(self.core.state_dict(), path)

    def load(self, path: str) -> int:
        import torch

        self.core.load_state_dict(torch.load(path, map_location="cpu", weights_only=False))
        return self.core.iteration
