"""The cluster side of a run's config (``train``), grouped by what each part governs:

- ``train.workers``: the rollout worker actors (how many, what Ray reserves for each,
  how long a rollout share may take);
- ``train.learner``: the learner group (ranks, micro-batch, what each rank reserves);
- ``train.eval``: the held-out evaluation (prompts, schedule, noise, and the evaluator
  actor's reservation when it has one) (these three in ``train_actors.py``);
- ``train.weights``: how a new weight version reaches the workers and how old a
  trajectory's weights may be;
- ``train.checkpoints``, ``train.memory`` (the plan's GPU check), ``train.metrics``
  (the Prometheus endpoint) and ``train.reward`` (the reward service).

Each actor kind's reservation is one model, :class:`ActorResources`
(``num_cpus``/``num_gpus``/``resources``), the same for workers, learner ranks, the
evaluator and job-started reward replicas. What governs the whole run (the prompts,
image size, text length, torch threads, placement and collective timeouts) sits at
``train``'s top level."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .actor import ActorResources
from .guard import GuardConfig
from .reward_service import RewardServiceConfig
from .section import Section
from .train_actors import EvalConfig, LearnerConfig, WorkersConfig


class WeightsConfig(Section):
    """``train.weights``: publishing weight versions to the rollout workers."""

    transport: Literal["object_store", "collective"] = Field(
        "object_store",
        description="how a new weight version reaches the rollout workers: one object-store "
        "put that every worker fetches, or a broadcast from learner rank 0 over a process "
        "group of the learner and the workers (NCCL on GPU, gloo on CPU); both verify the "
        "version and checksum, and a failed broadcast falls back to the object store",
    )
    staleness: int = Field(
        0,
        ge=0,
        description="max weight versions a trajectory may lag; >= 1 also rolls out the next "
        "iteration on the current weights while the learner updates (overlapped iterations)",
    )


class CheckpointsConfig(Section):
    """``train.checkpoints``: when the learner checkpoints and which checkpoints stay."""

    every: int = Field(5, ge=1, description="checkpoint every N iterations (and at the last)")
    every_minutes: float | None = Field(
        None,
        gt=0,
        description="also checkpoint after the first iteration that ends this many minutes "
        "of wall time after the session's start or its last checkpoint (a lost node or a "
        "retried job redoes at most about this much)",
    )
    at: list[int] = Field(
        default_factory=list, description="also checkpoint after these iterations (kept)"
    )
    keep: int | None = Field(
        None, ge=1, description="keep the newest N periodic checkpoints (None: all)"
    )


class OffloadConfig(Section):
    """``train.offload``: what each side of a colocated pair (``train.placement:
    colocated``) moves to the host while the other side has their GPU."""

    learner: Literal["auto", "none", "optimizer", "all"] = Field(
        "auto",
        description="while the worker rolls out, the learner rank keeps on the host: none "
        "(everything stays resident), optimizer (AdamW's moments only), all (fp32 weights, "
        "gradients and moments); auto: the least that the plan says fits beside the rollout",
    )
    worker: Literal["auto", "none", "all"] = Field(
        "auto",
        description="while the learner updates, the worker keeps its transformer on the host "
        "(all) or resident (none); auto: resident when the plan says it fits beside the update",
    )


class MemoryConfig(Section):
    """``train.memory``: the memory plan's check of a CUDA run (`g2rpo plan`)."""

    gpu_memory_gib: float = Field(
        80.0,
        gt=0,
        description="memory of one GPU of the cluster: `g2rpo plan` and `g2rpo train` check "
        "each actor's estimated peak against its share of it (80: H100/A100 80GB)",
    )
    ignore_plan: bool = Field(
        False,
        description="start a CUDA run even when `g2rpo plan` says an actor does not fit "
        "(for a user who knows better; recorded in the run's config)",
    )


class MetricsConfig(Section):
    """``train.metrics``: the driver's Prometheus endpoint."""

    port: int | None = Field(
        None, ge=0, le=65535, description="serve Prometheus metrics here (0 = any free port)"
    )
    host: str = Field(
        "127.0.0.1",
        description="address the metrics port binds (0.0.0.0 in a pod Prometheus scrapes)",
    )


class TrainConfig(Section):
    prompts: str = Field("shapes:train", description="'shapes:train' or a text file")
    image_size: int = Field(512, ge=16, description="generated images' side, in pixels")
    max_sequence_length: int = Field(512, ge=1, description="T5 prompt tokens")
    threads: int = Field(
        1,
        ge=1,
        description="torch CPU threads in each rollout worker, evaluator, learner rank and "
        "the run's own reward replicas",
    )
    placement: Literal["disaggregated", "colocated"] = Field(
        "disaggregated",
        description="where the rollout workers and learner ranks run: disaggregated (each on "
        "resources of its own; the learner ranks in a placement group of whole GPUs) or "
        "colocated (one placement bundle per learner rank holding rank i and rollout worker i "
        "on one GPU, which they take in turns: the rollout, then the update; "
        "train.workers.count = train.learner.count, train.weights.staleness 0)",
    )
    placement_timeout_s: float = Field(
        600.0, gt=0, description="fail when an actor is not placed by then (names the request)"
    )
    collective_timeout_s: float | None = Field(
        None,
        gt=0,
        description="a learner-group or weight-broadcast collective not done by then fails "
        "(a dead peer ends a broadcast here; the group is then formed again). None: scaled "
        "with the transformer's size on disk (common/cluster/timeouts.py: 120 s for the tiny "
        "world, "
        "about 18 min for FLUX.1-dev, whose rank 0 reads 23.8 GB while the others wait)",
    )
    actor_logs: bool = Field(
        True,
        description="on a cluster (RAY_ADDRESS), stream every actor's stdout and stderr to the "
        "driver's, so `ray job logs` shows an NCCL error or a watchdog's abort; a local Ray "
        "started by g2rpo train keeps them in its log files",
    )
    env_vars: dict[str, str] = Field(
        default_factory=dict,
        description="environment variables of every actor the run starts (rollout workers, "
        "learner ranks, evaluator, reward replicas): NCCL_SOCKET_IFNAME, NCCL_DEBUG, "
        "GLOO_SOCKET_IFNAME, TORCH_NCCL_* and the like, which the driver's shell does not reach",
    )
    workers: WorkersConfig = Field(default_factory=WorkersConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    weights: WeightsConfig = Field(default_factory=WeightsConfig)
    checkpoints: CheckpointsConfig = Field(default_factory=CheckpointsConfig)
    offload: OffloadConfig = Field(default_factory=OffloadConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    reward: RewardServiceConfig = Field(default_factory=RewardServiceConfig)
    guard: GuardConfig = Field(default_factory=GuardConfig)

    @model_validator(mode="after")
    def _reward_in_pairs(self) -> TrainConfig:
        problem = in_pairs_problem(self)
        if problem:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _guard_rules_for_the_size(self) -> TrainConfig:
        if self.guard.rules is None:  # none given: the size's own
            from .guard_defaults import default_rules

            self.guard.rules = default_rules(self.image_size)
        return self

    def ray_options(self, kind: ActorResources) -> dict:
        """The options ``Actor.options(**...)`` takes for an actor of ``kind`` (one of
        this section's actor kinds): its resources, and ``env_vars`` as its runtime
        environment."""
        options = kind.ray_options()
        if self.env_vars:
            options["runtime_env"] = {"env_vars": dict(self.env_vars)}
        return options

    def reward_bundles(self, redis_url: str | None = None) -> list[int]:
        """The learner bundles (colocated pairs) that hold the job's reward replicas under
        ``reward.in_pairs``: replica j in bundle j·pairs/replicas, spread over the pairs
        and so over their nodes; none otherwise (``redis_url``: one given on the command
        line, which makes the default replica count 0)."""
        if not self.reward.in_pairs:
            return []
        replicas, pairs = self.reward.job_replicas(redis_url), self.learner.count
        return [j * pairs // replicas for j in range(replicas)]

    def bundle_gpus(self) -> float:
        """GPUs each bundle of the learner group's placement group reserves: a colocated
        pair's one GPU (when either of them asks for a share of one), else the rank's
        own (``train.learner`` whole GPUs in a group)."""
        if self.placement == "colocated":
            return 1.0 if self.learner.num_gpus + self.workers.num_gpus > 0 else 0.0
        return self.learner.reserved_gpus()

    def actor_kinds(self) -> dict[str, ActorResources]:
        """The model-running actor kinds Ray places, by config path (the evaluator
        only when it is an actor of its own)."""
        kinds: dict[str, ActorResources] = {
            "train.workers": self.workers,
            "train.learner": self.learner,
        }
        if self.eval.on_actor:
            kinds["train.eval"] = self.eval
        return kinds


def colocated_problem(t: TrainConfig) -> str | None:
    """Why ``t`` cannot run colocated (None when it can, or is disaggregated). A colocated
    bundle is one GPU that learner rank i and rollout worker i take in turns, so: as many
    workers as ranks; no rollout beside the update (staleness 0); no weight broadcast,
    whose NCCL group would hold rank 0 and worker 0 on one GPU; their shares within the
    bundle's one GPU."""
    if t.placement != "colocated":
        return None
    w, r = t.workers, t.learner
    if w.count != r.count:
        return (
            "train.placement colocated pairs rollout worker i with learner rank i on one GPU: "
            f"train.workers.count {w.count} and train.learner.count {r.count} must be equal"
        )
    if t.weights.staleness != 0:
        return (
            "train.placement colocated takes turns on each GPU (the rollout, then the update): "
            f"train.weights.staleness must be 0, got {t.weights.staleness}"
        )
    if t.weights.transport == "collective":
        return (
            "train.placement colocated with train.weights.transport collective would put "
            "learner rank 0 and rollout worker 0, two ranks of the broadcast's NCCL group, on "
            "one GPU, which NCCL refuses: use train.weights.transport object_store"
        )
    if w.num_gpus + r.num_gpus > 1:
        return (
            f"train.placement colocated: train.workers.num_gpus {w.num_gpus:g} + "
            f"train.learner.num_gpus {r.num_gpus:g} exceed the one GPU a bundle holds"
        )
    return None


def in_pairs_problem(t: TrainConfig) -> str | None:
    """Why ``train.reward.in_pairs`` cannot hold (None when it can, or is off): the
    replicas go into the colocated pairs' bundles, one per bundle at most, and take a
    share of the bundle's one GPU beside the pair's."""
    r = t.reward
    if not r.in_pairs:
        return None
    if t.placement != "colocated":
        return (
            "train.reward.in_pairs places the reward replicas in the colocated pairs' bundles: "
            f"train.placement must be colocated, got {t.placement}"
        )
    replicas = r.job_replicas()
    if not 1 <= replicas <= t.learner.count:
        return (
            f"train.reward.in_pairs: the job's {replicas} reward replicas (train.reward.replicas)"
            f" must be between 1 and the {t.learner.count} pairs (train.learner.count), one "
            "per pair at most"
        )
    shares = t.workers.num_gpus + t.learner.num_gpus + r.num_gpus
    if shares > 1 + 1e-9:
        return (
            f"train.reward.in_pairs: train.workers.num_gpus {t.workers.num_gpus:g} + "
            f"train.learner.num_gpus {t.learner.num_gpus:g} + train.reward.num_gpus "
            f"{r.num_gpus:g} exceed the one GPU a pair's bundle holds (e.g. 0.45 + 0.45 + 0.1)"
        )
    return None
