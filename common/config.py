"""Every knob of a run as pydantic models, loaded from YAML with ``a.b=c`` overrides.

Unknown keys are errors (a typo must never silently fall back to a default), and
every validation error names the dotted field and the offending value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from .config_algorithm import AlgorithmConfig, OptimConfig, check_method
from .config_train import Section, TrainConfig, colocated_problem
from .errors import ConfigError
from .paths import config_candidates, find_config

FLUX_LORA_TARGETS = [
    "to_q",
    "to_k",
    "to_v",
    "to_out.0",
    "add_q_proj",
    "add_k_proj",
    "add_v_proj",
    "to_add_out",
]


class LoraOptions(Section):
    """Train low-rank adapters (peft) instead of the whole transformer; the learner
    then publishes, checkpoints and exports the adapters only."""

    rank: int = Field(32, ge=1, description="r")
    alpha: float = Field(64.0, gt=0, description="scale = alpha / r")
    target_modules: list[str] = Field(
        default_factory=lambda: list(FLUX_LORA_TARGETS),
        description="module names (suffixes) that get adapters: FLUX attention projections",
    )
    init: Literal["gaussian", "default"] = Field(
        "gaussian", description="A's init (B starts at zero, so step 0 is the base model)"
    )

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("needs at least one module name")
        return v


class ModelConfig(Section):
    pretrained: str | None = Field(
        None,
        description="Local diffusers pipeline directory; None = the built-in random test model",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="compute dtype: the transformer runs under autocast in it while its "
        "weights stay float32 (the official code's fp32 master weights + bf16 autocast)",
    )
    device: str = "cpu"
    guidance: float = Field(
        3.5,
        description="FLUX: the distilled guidance embedding's value; SD3: the classifier-free "
        "guidance scale (4.5 in SD3.5-Medium's recipes; <= 1 runs the model once a call, "
        "without the empty prompt)",
    )
    quantize_timestep: bool = Field(True, description="feed floor(1000σ)/1000 as the official code")
    lora: LoraOptions | None = Field(None, description="train LoRA adapters; None = full")
    rollout_weights_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="the dtype rollout workers hold published weights in (they never train): "
        "bfloat16 halves the bytes pushed and their memory, under model.dtype bfloat16; the "
        "learner keeps float32 master weights either way",
    )
    mixed_precision: Literal["autocast", "fsdp"] = Field(
        "autocast",
        description="how the learner computes in model.dtype: autocast over float32 weights, "
        "or FSDP2's mixed-precision policy (parameters gathered in model.dtype, gradients "
        "reduced in float32; full fine-tunes only)",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="the learner recomputes each transformer block's activations in the "
        "backward instead of saving them (diffusers' enable_gradient_checkpointing): the same "
        "gradients for ~1/40 of the activation memory at FLUX.1-dev size, ~1 more forward",
    )
    attention_backend: Literal["auto", "flash", "efficient", "cudnn", "math"] = Field(
        "auto",
        description="torch SDPA kernels the transformer may use. auto: every kernel but "
        "cuDNN's (its fused attention backward crashed a learner on an H100 with "
        "torch 2.11 / cuDNN 9.19); cudnn: cuDNN only; flash, efficient, math: that kernel only",
    )
    compile: Literal["none", "blocks", "blocks_cuda_graphs"] = Field(
        "none",
        description="the rollout workers' transformer (never the learner's): none runs it "
        "eagerly; blocks compiles each repeated transformer block with torch.compile "
        "(regional compilation, diffusers' compile_repeated_blocks: one compile per block "
        "class, shared by all its blocks, paid in the first rollout); blocks_cuda_graphs also "
        "replays each block as a CUDA graph (torch.compile mode reduce-overhead): CUDA only",
    )
    rollout_attention_backend: Literal[
        "same", "fastest", "auto", "flash", "efficient", "cudnn", "math"
    ] = Field(
        "same",
        description="the SDPA kernels of the rollout workers' transformer: same is "
        "model.attention_backend; fastest times every kernel forward-only at the rollout's "
        "first attention shape on the worker's device (its GPU, or the CPU) and samples with "
        "the fastest that runs; a name: that value of model.attention_backend. The learner "
        "keeps model.attention_backend (its recompute then runs another kernel: rounding)",
    )

    @model_validator(mode="after")
    def _cuda_graphs_on_cuda(self) -> ModelConfig:
        if self.compile == "blocks_cuda_graphs" and not self.device.startswith("cuda"):
            raise ValueError(
                f"model.compile blocks_cuda_graphs: CUDA graphs exist on CUDA devices only and "
                f"model.device is {self.device}: use model.compile blocks (or none) there"
            )
        return self

    @model_validator(mode="after")
    def _precision(self) -> ModelConfig:
        if self.rollout_weights_dtype == "bfloat16":
            if self.dtype != "bfloat16":
                raise ValueError(
                    "model.rollout_weights_dtype bfloat16 needs model.dtype bfloat16 (the "
                    f"rollout computes in model.dtype; got {self.dtype})"
                )
            if self.lora is not None:
                raise ValueError(
                    "model.rollout_weights_dtype bfloat16 is for a full fine-tune's published "
                    "weights; a LoRA run (model.lora) already holds its base in model.dtype "
                    "and publishes its adapters in float32"
                )
        if self.mixed_precision == "fsdp":
            if self.lora is not None:
                raise ValueError(
                    "model.mixed_precision fsdp shards a full fine-tune; a LoRA run "
                    "(model.lora) holds its base in model.dtype already: use autocast"
                )
            if self.dtype == "float32":
                raise ValueError(
                    "model.mixed_precision fsdp computes in model.dtype, which is float32: "
                    "there is nothing to mix (set model.dtype bfloat16, or use autocast; "
                    "train.learner.count > 1 shards with FSDP2 either way)"
                )
        return self

    def check_trainable(self) -> None:
        if self.dtype == "float16":
            raise ConfigError(
                "model.dtype float16: training needs loss scaling, which g2rpo does not do; "
                "use bfloat16 (or float32)"
            )

    def base_weights_dtype(self):
        """Trained weights stay float32 (master weights; compute is autocast to
        ``dtype``). A LoRA run never trains the base, so it is held in ``dtype``."""
        import torch

        return getattr(torch, self.dtype) if self.lora is not None else torch.float32

    def rollout_weights_torch_dtype(self):
        """The dtype of the rollout workers' transformer: a LoRA run's base is held in
        ``dtype``; a full fine-tune's published weights in ``rollout_weights_dtype``."""
        import torch

        if self.lora is not None:
            return self.base_weights_dtype()
        return getattr(torch, self.rollout_weights_dtype)

    def autocast_dtype(self):
        """None for float32, else the torch dtype the transformer computes in."""
        import torch

        return None if self.dtype == "float32" else getattr(torch, self.dtype)


class SamplingConfig(Section):
    num_steps: int = Field(16, ge=2, le=1000, description="T, the sampling grid length")
    shift: float = Field(3.0, gt=0, description="SD3/FLUX static time shift")
    sigma_grid: Literal["uniform", "diffusers"] = Field(
        "uniform",
        description="uniform: shift(linspace(1, 0, T+1)), the official FLUX code's grid; "
        "diffusers: FlowMatchEulerDiscreteScheduler's own σ after set_timesteps(T), as "
        "StableDiffusion3Pipeline and Flow-GRPO's SD3 code sample (its last σ is not 1/T's)",
    )
    eta: float = Field(0.7, ge=0, description="SDE noise level η")
    sde_steps: list[int] = Field(default_factory=lambda: list(range(8)))
    granularities: list[int] = Field(default_factory=lambda: [1, 2])
    terminal: Literal["exact", "reference"] = "exact"
    group_size: int = Field(12, ge=2, description="G, branches per group")
    prompts_per_worker: int = Field(1, ge=1)
    max_batch: int = Field(256, ge=1, description="largest batch of one model call")
    decode_batch: int = Field(
        64, ge=1, description="images per VAE decode call (its activations grow with image size)"
    )
    execution: Literal["batched", "reference"] = "batched"
    sde_type: Literal["auto", "flow", "dance", "cps"] = Field(
        "auto",
        description="the SDE of the stochastic steps: auto = the method's own (DanceGRPO's "
        "g = η, Flow-GRPO's elsewhere), or Coefficients-Preserving Sampling (cps, η <= 1)",
    )

    @field_validator("sde_steps")
    @classmethod
    def _sde_steps(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("needs at least one SDE step")
        if len(set(v)) != len(v):
            raise ValueError(f"has duplicates: {v}")
        if min(v) < 0:
            raise ValueError(f"steps must be >= 0: {v}")
        return sorted(v)

    @field_validator("granularities")
    @classmethod
    def _granularities(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("needs at least one granularity")
        if min(v) < 1 or len(set(v)) != len(v):
            raise ValueError(f"must be distinct integers >= 1: {v}")
        return v

    @model_validator(mode="after")
    def _steps_within_grid(self) -> SamplingConfig:
        bad = [k for k in self.sde_steps if k > self.num_steps - 2]
        if bad:
            raise ValueError(
                f"sde_steps {bad} exceed num_steps-2={self.num_steps - 2}: the last step ends at "
                "sigma=0 where the SDE density degenerates"
            )
        return self


class RewardSpec(Section):
    name: str
    weight: float = 1.0


class RunConfig(Section):
    name: str = "run"
    seed: int = 42
    iterations: int = Field(100, ge=1, description="at most this many iterations")
    nfe_budget: int | None = Field(
        None,
        ge=1,
        description="stop before the run's training NFEs (the algorithm's rollout plus the "
        "learner's forwards; evaluation excluded) would pass this many",
    )
    output_dir: str = "runs"
    max_failures: int = Field(
        2,
        ge=0,
        description="learner-group failures a session recovers from by itself: when a learner "
        "rank's process dies, the group is stopped, formed again from the last checkpoint "
        "(as --resume) and the run goes on, reproducing the uninterrupted run; one more ends "
        "the run (as Ray Train's FailureConfig.max_failures; 0: stop at the first)",
    )


class G2RPOConfig(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    rewards: list[RewardSpec] = Field(default_factory=lambda: [RewardSpec(name="shapes_clip")])
    run: RunConfig = Field(default_factory=RunConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)

    @field_validator("rewards")
    @classmethod
    def _rewards(cls, v: list[RewardSpec]) -> list[RewardSpec]:
        if not v:
            raise ValueError("needs at least one reward")
        names = [r.name for r in v]
        if len(set(names)) != len(names):
            raise ValueError(f"reward names must be unique: {names}")
        return v

    @model_validator(mode="after")
    def _gpus_for_cuda(self) -> G2RPOConfig:
        """A CUDA run's model-running actors each need a GPU from Ray, and the ranks of
        a learner group a whole one each."""
        device, t = self.model.device, self.train
        if not device.startswith("cuda"):
            return self
        for path, kind in t.actor_kinds().items():
            if kind.num_gpus <= 0:
                also = " (or train.eval.on_actor: false)" if path == "train.eval" else ""
                raise ValueError(
                    f"model.device is {device} but {path}.num_gpus is {kind.num_gpus:g}: "
                    "those actors would run the model on a GPU Ray did not reserve for them; "
                    f"give each one ({path}.num_gpus: 1, or a fraction to share one){also}"
                )
        # Learner ranks sit in placement-group bundles of whole GPUs (orchestration/
        # placement.py), so two ranks of the learner group never share one. The weight
        # broadcast's group (learner rank 0 and every worker) has no such bundles: a
        # fraction of a GPU there could put two of its ranks on one device.
        if t.weights.transport == "collective":
            shared = {
                f"train.{name}.num_gpus": kind.num_gpus
                for name, kind in (("learner", t.learner), ("workers", t.workers))
                if kind.num_gpus < 1
            }
            if shared:
                fields = ", ".join(f"{k} {v:g}" for k, v in shared.items())
                raise ValueError(
                    f"train.weights.transport collective on CUDA with {fields}: the weight "
                    "broadcast's NCCL group (learner rank 0 and every rollout worker) could "
                    "get two ranks on one GPU, which NCCL refuses; give them whole GPUs or "
                    "use train.weights.transport: object_store"
                )
        return self

    @model_validator(mode="after")
    def _colocated_layout(self) -> G2RPOConfig:
        problem = colocated_problem(self.train)
        if problem:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _method_fits_its_sampler(self) -> G2RPOConfig:
        check_method(self)
        return self

    def sde_type(self) -> str:
        """The SDE the stochastic steps take: ``sampling.sde_type``, or the method's own."""
        if self.sampling.sde_type != "auto":
            return self.sampling.sde_type
        return "dance" if self.algorithm.name in ("dancegrpo", "branchgrpo") else "flow"

    def fast_branch_max(self) -> int:
        """Flow-GRPO-Fast's largest branch step (its original code: T//2)."""
        b = self.algorithm.flowgrpo_fast.branch_max
        return self.sampling.num_steps // 2 if b is None else b

    def branch_pruning_active(self, iteration: int) -> bool:
        """BranchGRPO prunes (depth and width) while iteration <= ⌊prune_until ×
        run.iterations⌋ (their pruning_step_ratio)."""
        return iteration <= int(self.run.iterations * self.algorithm.branchgrpo.prune_until)

    def reward_weights(self) -> dict[str, float]:
        return {r.name: r.weight for r in self.rewards}


def _format_errors(err: ValidationError, data: dict[str, Any]) -> str:
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"])
        value = e.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        # a validator's own message (ValueError) is phrased for the user already
        own = e.get("ctx", {}).get("error") if e["type"] == "value_error" else None
        msg = e["msg"] if own is None else str(own)
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        lines.append(f"  {path}: {msg}{shown}" if path else f"  {msg}")
    if len(lines) == 1:  # one line for one problem
        return "invalid configuration: " + lines[0].strip()
    return "invalid configuration:\n" + "\n".join(lines)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error in one line: what the parser found and where."""
    what = ": ".join(
        str(part) for part in (getattr(exc, "context", None), getattr(exc, "problem", None)) if part
    )
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return (what or " ".join(str(exc).split())) + where


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one ``a.b.c=value`` override in place; the value is parsed as YAML."""
    if "=" not in assignment:
        raise ConfigError(f"override {assignment!r} must look like section.field=value")
    key, raw = assignment.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"override {assignment!r} has an empty field path")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"override {key}: cannot parse value {raw!r}: {yaml_problem(exc)}"
        ) from None
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}: {'.'.join(parts[: i + 1])} is not a section")
        node = child
    node[parts[-1]] = value


def config_from_dict(data: dict[str, Any], overrides: list[str] | None = None) -> G2RPOConfig:
    data = yaml.safe_load(yaml.safe_dump(data)) if data else {}
    for assignment in overrides or []:
        apply_override(data, assignment)
    try:
        return G2RPOConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, data)) from None


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> G2RPOConfig:
    """Read a YAML config (or the defaults when path is None) and apply overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        found = find_config(path)
        if found is None:
            tried = ", ".join(str(c) for c in config_candidates(path))
            raise ConfigError(f"config file not found: {path} (looked at {tried})")
        path = found
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {yaml_problem(exc)}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read it: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping, got {type(loaded).__name__}")
        data = loaded or {}
    return config_from_dict(data, overrides)


def dump_config(cfg: G2RPOConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
