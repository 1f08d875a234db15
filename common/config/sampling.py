"""``sampling``: the σ grid, the branches G²RPO takes from the anchor
and the groups they form."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from .section import Section


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
