"""``train.workers``, ``train.learner`` and ``train.eval``: the
actors' counts, reservations and schedules."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from .actor import ActorResources


class WorkersConfig(ActorResources):
    """``train.workers``: the rollout worker actors; num_cpus/num_gpus/resources per worker."""

    count: int = Field(1, ge=1, description="rollout worker actors")
    rollout_timeout_s: float | None = Field(
        None,
        gt=0,
        description="a worker whose rollout share (or weight load) is not back by then is "
        "killed, restarted by Ray and redoes that share once (None: wait as long as it takes)",
    )
    start_timeout_s: float | None = Field(
        None,
        gt=0,
        description="how long a rollout worker (or the evaluator) Ray restarted may take to "
        "load its pipeline again before the run stops (None: scaled with the pipeline's size "
        "on disk, common/cluster/timeouts.py)",
    )
    prompt_counts: list[int] | None = Field(
        None,
        description="prompts each worker rolls out per iteration, worker by worker (one "
        "entry per worker, each >= 1), in place of sampling.prompts_per_worker for all: 16 "
        "prompts on 7 workers are [3, 3, 2, 2, 2, 2, 2]. Each worker's rollout plan and "
        "noise follow its own count; the learner ranks split the iteration's states "
        "evenly whatever worker sampled them (None: sampling.prompts_per_worker each)",
    )

    @model_validator(mode="after")
    def _one_count_per_worker(self) -> WorkersConfig:
        counts = self.prompt_counts
        if counts is None:
            return self
        if len(counts) != self.count:
            raise ValueError(
                f"train.workers.prompt_counts has {len(counts)} entries and "
                f"train.workers.count is {self.count}: give one count per worker (or null, "
                "for sampling.prompts_per_worker each)"
            )
        if min(counts) < 1:
            raise ValueError(
                f"train.workers.prompt_counts {counts}: every worker needs at least one "
                "prompt (fewer workers, or null)"
            )
        return self

    def prompt_shares(self, per_worker: int) -> list[int]:
        """Each worker's prompts per iteration: ``prompt_counts``, else ``per_worker``
        (``sampling.prompts_per_worker``) for every worker."""
        if self.prompt_counts is not None:
            return list(self.prompt_counts)
        return [per_worker] * self.count


class LearnerConfig(ActorResources):
    """``train.learner``: the learner group; num_cpus/num_gpus/resources per rank."""

    count: int = Field(
        1,
        ge=1,
        description="learner ranks (actors) forming one torch.distributed group (gloo on CPU, "
        "NCCL on GPU): FSDP2 over the transformer for a full fine-tune, data parallel for "
        "LoRA; each rank takes its share of the transitions",
    )
    max_batch: int = Field(
        64,
        ge=1,
        description="distinct states in one learner forward/backward (its micro-batch): "
        "the learner's saved activations grow with it",
    )
    placement_strategy: Literal["STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD"] = Field(
        "STRICT_PACK",
        description="how Ray's placement group lays out the learner ranks' bundles (one per "
        "rank, whole GPUs): STRICT_PACK keeps the group on one node (FSDP2 traffic over "
        "NVLink, not the network); PACK where no node holds them all",
    )

    def reserved_gpus(self) -> float:
        """GPUs Ray reserves for each rank: its ``num_gpus`` for a single learner, whole
        GPUs for each rank of a group (its placement bundle), so no two ranks of one
        NCCL group can share a GPU."""
        if self.count == 1:
            return self.num_gpus
        return float(math.ceil(self.num_gpus))


class EvalConfig(ActorResources):
    """``train.eval``: the held-out evaluation; num_cpus/num_gpus/resources are the
    evaluator actor's (used when ``on_actor`` is true)."""

    prompts: str = Field("shapes:held_out", description="'shapes:held_out' or a text file")
    every: int = Field(
        5,
        ge=1,
        description="evaluate the held-out prompts every N iterations (and the trained "
        "weights once the run finishes, or a session's last iteration that stops short)",
    )
    every_nfe: int | None = Field(
        None,
        ge=1,
        description="instead of train.eval.every: evaluate whenever this many training NFEs "
        "passed since the last evaluation (methods compared at equal NFEs share eval points)",
    )
    samples: int = Field(40, ge=1, description="held-out prompts evaluated (the first N)")
    per_prompt: int = Field(4, ge=1, description="fixed-noise samples per eval prompt")
    seed: int = Field(
        10_000, description="eval noise seed: the same noise for every run and iteration"
    )
    keep_images: bool = Field(
        False,
        description="save every evaluation image as evals/it_N.images.npz (a study measures "
        "them afterwards; 400 images of 720² are 593 MiB an evaluation)",
    )
    on_actor: bool = Field(
        True,
        description="evaluate on an actor of its own, concurrently with the rollout; false: "
        "spread over the rollout workers before the rollout, each a slice (a FLUX evaluation "
        "of 400 samples on 16 workers is 25 samples each, ~43 s, where one evaluator takes "
        "~11 min and holds the driver at every evaluation)",
    )
    timeout_s: float | None = Field(
        None,
        gt=0,
        description="an evaluation not back by then is abandoned: the run goes on, its row "
        "says the evaluation timed out, and the evaluator is restarted (None: wait as long "
        "as it takes)",
    )
