"""The cluster side of a run's config (``train``), grouped by what each part governs:

- ``train.workers``: the rollout worker actors (how many, what Ray reserves for each,
  how long a rollout share may take);
- ``train.learner``: the learner group (ranks, micro-batch, what each rank reserves);
- ``train.eval``: the held-out evaluation (prompts, schedule, noise, and the evaluator
  actor's reservation when it has one);
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

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from .config_guard import GuardConfig
from .config_section import Section

Resources = dict[str, float]


class ActorResources(Section):
    """What Ray reserves for each actor of one kind (one of ``train.workers``,
    ``train.learner``, ``train.eval``, ``train.reward``)."""

    num_cpus: float = Field(1.0, ge=0, description="CPUs Ray reserves for each actor")
    num_gpus: float = Field(
        0.0,
        ge=0,
        description="GPUs Ray reserves for each actor (a fraction packs actors onto one GPU)",
    )
    resources: Resources = Field(
        default_factory=dict,
        description="custom Ray resources each actor needs, name: amount (not CPU/GPU)",
    )

    def ray_options(self) -> dict:
        """The options ``Actor.options(**...)`` takes for this kind of actor."""
        return {
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "resources": dict(self.resources),
        }

    @field_validator("resources")
    @classmethod
    def _resources(cls, v: Resources) -> Resources:
        for name, amount in v.items():
            if name in ("CPU", "GPU"):
                raise ValueError(f"give {name} through the num_cpus/num_gpus fields, not resources")
            if amount <= 0:
                raise ValueError(f"{name}: amount must be > 0, got {amount}")
        return v


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
        "on disk, common/timeouts.py)",
    )


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


class RewardServiceConfig(ActorResources):
    """``train.reward``: the reward service; num_cpus/num_gpus/resources per
    job-started replica."""

    urls: list[str] = Field(default_factory=list, description="static replica URLs")
    redis_url: str | None = Field(None, description="discover replicas in this Redis")
    replicas: int | None = Field(
        None,
        ge=0,
        description="reward-server replicas the job starts as Ray actors "
        "(None: 1 when no urls/redis_url are given, else 0)",
    )
    scorers: list[str] = Field(
        default_factory=list,
        description="NAME or NAME=LOCAL_DIR: what job-started replicas serve besides the "
        "rewards; every held-out evaluation scores these too (a scorer not trained on is a "
        "held-out reward: eval/drift/*), on whichever replicas serve the run",
    )
    token_env: str | None = Field(
        None,
        description="env var holding the reward servers' bearer token (at least 32 bytes: "
        "`openssl rand -hex 32`); None: the job's replicas get a fresh one of their own",
    )
    redis_password_env: str | None = Field(
        None,
        description="env var holding the password of the Redis replicas register in "
        "(redis_url, --redis-url); the value stays in memory, never in config.yaml",
    )
    tls_ca_file: str | None = Field(
        None,
        description="CA bundle (PEM) the driver and workers verify https:// reward servers "
        "with (None: the system's CAs)",
    )
    tls_cert_file: str | None = Field(
        None,
        description="certificate (PEM) the job's replicas serve HTTPS with: a path on "
        "every node they may run on, naming the nodes' addresses",
    )
    tls_key_file: str | None = Field(
        None, description="private key of tls_cert_file, a path on the same nodes"
    )
    deadline_s: float = Field(
        300.0,
        gt=0,
        description="a scoring request no replica answered by then fails the rollout share",
    )
    request_mib: float = Field(
        32.0,
        gt=0,
        description="largest body of one scoring request a worker or the evaluator sends: a "
        "rollout's leaves (193 images of 720² are 286 MiB) go as several requests of at most "
        "this size, sent concurrently",
    )
    concurrency: int = Field(
        4, ge=1, description="scoring requests one worker or the evaluator keeps in flight"
    )
    max_payload_mib: float = Field(
        64.0,
        gt=0,
        description="request body limit of the replicas this job starts (`g2rpo reward-server "
        "--max-payload-mib` for your own): at least train.reward.request_mib",
    )

    @model_validator(mode="after")
    def _request_fits_replicas(self) -> RewardServiceConfig:
        if self.request_mib > self.max_payload_mib:
            raise ValueError(
                f"train.reward.request_mib {self.request_mib:g} is over "
                f"train.reward.max_payload_mib {self.max_payload_mib:g}: the job's replicas "
                "would refuse every full request (raise max_payload_mib, or lower request_mib)"
            )
        return self

    @model_validator(mode="after")
    def _certificate_with_its_key(self) -> RewardServiceConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            given, missing = (
                ("tls_cert_file", "tls_key_file")
                if self.tls_key_file is None
                else ("tls_key_file", "tls_cert_file")
            )
            raise ValueError(
                f"train.reward.{given} is given without train.reward.{missing}: the job's "
                "replicas need a certificate and its private key"
            )
        return self

    def job_replicas(self, redis_url: str | None = None) -> int:
        """Replicas the job starts: ``replicas``, or by default one only when no
        external ones are given (``redis_url``: one passed on the command line)."""
        if self.replicas is not None:
            return self.replicas
        return int(not (self.urls or self.redis_url or redis_url))


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
        "with the transformer's size on disk (common/timeouts.py: 120 s for the tiny world, "
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

    def ray_options(self, kind: ActorResources) -> dict:
        """The options ``Actor.options(**...)`` takes for an actor of ``kind`` (one of
        this section's actor kinds): its resources, and ``env_vars`` as its runtime
        environment."""
        options = kind.ray_options()
        if self.env_vars:
            options["runtime_env"] = {"env_vars": dict(self.env_vars)}
        return options

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
