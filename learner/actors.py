"""Thin Ray actors around the pure worker and learner cores."""

from __future__ import annotations

import ray

from ..common.config import G2RPOConfig


@ray.remote(max_restarts=-1, max_task_retries=0)
class RolloutWorker:
    """Holds a pipeline; loads published weights; rolls out its share of prompts."""

    def __init__(self, cfg: dict, worker: int) -> None:
        from ..rollout_worker.worker import RolloutWorkerCore

        self.core = RolloutWorkerCore(G2RPOConfig.model_validate(cfg), worker)

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


@ray.remote(max_restarts=0)
class Learner:
    """Fuses advantages, updates the policy, publishes (version, weights) once."""

    def __init__(self, cfg: dict) -> None:
        from .trainer import LearnerCore

        self.core = LearnerCore(G2RPOConfig.model_validate(cfg))

    def publish(self):
        version, state, checksum = self.core.weights()
        return version, [ray.put(state)], checksum  # one object per version, shared by all

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
