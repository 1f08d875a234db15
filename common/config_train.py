"""The cluster side of a run's config: where actors are placed (``train``), how
many learners form the learner group, how weights reach the rollout workers, and
the reward service (``train.reward``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Section(BaseModel):
    """Unknown keys are errors; assignments are validated (shared by every section)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


Resources = dict[str, float]


def _check_resources(v: Resources) -> Resources:
    for name, amount in v.items():
        if name in ("CPU", "GPU"):
            raise ValueError(f"give {name} through the num_cpus/num_gpus fields, not resources")
        if amount <= 0:
            raise ValueError(f"{name}: amount must be > 0, got {amount}")
    return v


class RewardServiceConfig(Section):
    urls: list[str] = Field(default_factory=list, description="static replica URLs")
    redis_url: str | None = Field(None, description="discover replicas in this Redis")
    replicas: int | None = Field(
        None,
        ge=0,
        description="reward-server replicas the job starts as Ray actors "
        "(None: 1 when no urls/redis_url are given, else 0)",
    )
    num_cpus: float = Field(1.0, ge=0, description="per job-started replica")
    num_gpus: float = Field(0.0, ge=0, description="per job-started replica")
    resources: Resources = Field(default_factory=dict, description="custom Ray resources")
    scorers: list[str] = Field(
        default_factory=list, description="NAME or NAME=LOCAL_DIR for job-started replicas"
    )

    @model_validator(mode="before")
    @classmethod
    def _start_local(cls, data: Any) -> Any:
        """Run directories written before `replicas` existed say `start_local`."""
        if isinstance(data, dict) and "start_local" in data:
            data = dict(data)
            start = data.pop("start_local")
            if not start and data.get("replicas") is None:
                data["replicas"] = 0
        return data

    token_env: str | None = None
    deadline_s: float = Field(300.0, gt=0)

    def job_replicas(self, redis_url: str | None = None) -> int:
        """Replicas the job starts: ``replicas``, or by default one only when no
        external ones are given (``redis_url``: one passed on the command line)."""
        if self.replicas is not None:
            return self.replicas
        return int(not (self.urls or self.redis_url or redis_url))

    @field_validator("resources")
    @classmethod
    def _resources(cls, v: Resources) -> Resources:
        return _check_resources(v)


class TrainConfig(Section):
    workers: int = Field(1, ge=1, description="rollout worker actors")
    worker_num_cpus: float = Field(1.0, ge=0)
    worker_num_gpus: float = Field(0.0, ge=0)
    worker_resources: Resources = Field(default_factory=dict, description="custom Ray resources")
    learners: int = Field(
        1,
        ge=1,
        description="learner actors forming one torch.distributed group (gloo on CPU, NCCL on "
        "GPU): FSDP2 over the transformer for a full fine-tune, data parallel for LoRA; each "
        "rank takes its share of the transitions. learner_* below is per learner",
    )
    learner_max_batch: int = Field(
        64,
        ge=1,
        description="distinct states in one learner forward/backward (its micro-batch): "
        "the learner's saved activations grow with it",
    )
    learner_num_cpus: float = Field(1.0, ge=0)
    learner_num_gpus: float = Field(0.0, ge=0)
    learner_resources: Resources = Field(default_factory=dict, description="custom Ray resources")
    placement_timeout_s: float = Field(
        600.0, gt=0, description="fail when an actor is not placed by then (names the request)"
    )
    rollout_timeout_s: float | None = Field(
        None,
        gt=0,
        description="a worker whose rollout share is not back by then is killed, restarted by "
        "Ray and redoes that share once (None: wait as long as it takes)",
    )
    weight_transport: Literal["object_store", "collective"] = Field(
        "object_store",
        description="how a new weight version reaches the rollout workers: one object-store "
        "put that every worker fetches, or a broadcast from learner rank 0 over a process "
        "group of the learner and the workers (NCCL on GPU, gloo on CPU); both verify the "
        "version and checksum, and a failed broadcast falls back to the object store",
    )
    collective_timeout_s: float = Field(
        120.0,
        gt=0,
        description="a learner-group or weight-broadcast collective not done by then fails "
        "(a dead peer ends a broadcast here; the group is then formed again)",
    )
    worker_threads: int = Field(1, ge=1, description="torch threads per actor (CPU)")
    gpu_memory_gib: float = Field(
        80.0,
        gt=0,
        description="memory of one GPU of the cluster: `g2rpo plan` and `g2rpo train` check "
        "each actor's estimated peak against its share of it (80: H100/A100 80GB)",
    )
    ignore_memory_plan: bool = Field(
        False,
        description="start a CUDA run even when `g2rpo plan` says an actor does not fit "
        "(for a user who knows better; recorded in the run's config)",
    )
    image_size: int = Field(512, ge=16)
    max_sequence_length: int = Field(512, ge=1)
    prompts: str = Field("shapes:train", description="'shapes:train' or a text file")
    eval_prompts: str = Field("shapes:held_out")
    eval_every: int = Field(5, ge=1, description="evaluate the held-out prompts every N iterations")
    eval_every_nfe: int | None = Field(
        None,
        ge=1,
        description="instead of eval_every: evaluate whenever this many training NFEs "
        "passed since the last evaluation (methods compared at equal NFEs share eval points)",
    )
    eval_samples: int = Field(40, ge=1, description="held-out prompts evaluated (the first N)")
    eval_per_prompt: int = Field(4, ge=1, description="fixed-noise samples per eval prompt")
    eval_seed: int = Field(
        10_000, description="eval noise seed: the same noise for every run and iteration"
    )
    eval_actor: bool = Field(
        True,
        description="evaluate on an actor of its own, concurrently with the rollout "
        "(off the critical path); false: on rollout worker 0 before the rollout",
    )
    eval_num_cpus: float = Field(1.0, ge=0)
    eval_num_gpus: float = Field(0.0, ge=0)
    eval_resources: Resources = Field(default_factory=dict, description="custom Ray resources")
    checkpoint_every: int = Field(5, ge=1)
    checkpoint_at: list[int] = Field(
        default_factory=list, description="also checkpoint after these iterations (kept)"
    )
    keep_checkpoints: int | None = Field(
        None, ge=1, description="keep the newest N periodic checkpoints (None: all)"
    )
    staleness: int = Field(
        0,
        ge=0,
        description="max weight versions a trajectory may lag; >= 1 also rolls out the next "
        "iteration on the current weights while the learner updates (overlapped iterations)",
    )
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="serve Prometheus metrics here (0 = any free port)"
    )
    metrics_host: str = Field(
        "127.0.0.1",
        description="address the metrics port binds (0.0.0.0 in a pod Prometheus scrapes)",
    )
    reward: RewardServiceConfig = Field(default_factory=RewardServiceConfig)

    @field_validator("worker_resources", "learner_resources", "eval_resources")
    @classmethod
    def _resources(cls, v: Resources) -> Resources:
        return _check_resources(v)
