"""What Ray reserves for each actor of one kind (``train.workers``, ``train.learner``,
``train.eval``, ``train.reward``): one model shared by every actor kind's section."""

from __future__ import annotations

from pydantic import Field, field_validator

from .section import Section

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
