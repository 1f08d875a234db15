"""Every knob of a run as pydantic models: ``G2RPOConfig``, the run and its rewards, over the
sections of common/config/ (``loading.py`` reads it from YAML with ``a.b=c`` overrides).

Unknown keys are errors (a typo must never silently fall back to a default), and
every validation error names the dotted field and the offending value.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from .algorithm import AlgorithmConfig, OptimConfig, check_method
from .model import ModelConfig
from .sampling import SamplingConfig
from .section import Section
from .train import TrainConfig, colocated_problem


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
