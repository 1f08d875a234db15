"""``train.guard``: stop a run that is hacking its reward, judged at each evaluation by
rules on its image-health measures and reward drift (``common/health/guard.py``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .section import Section

_TESTS = ("rises_by", "falls_by", "rises_rel", "falls_rel", "above", "below")


class GuardRule(Section):
    """One signal of an evaluation and when it counts as crossed. ``signal`` names an
    evaluation entry without its ``eval/`` prefix: ``health/high_freq``,
    ``drift/diverging``, a scorer such as ``shapes_oracle/pass``."""

    signal: str
    rises_by: float | None = Field(
        None,
        description="crossed when the 95% CI of the paired change since the run's "
        "first evaluation lies wholly above this (same prompts, same noise)",
    )
    falls_by: float | None = Field(
        None, description="crossed when that CI lies wholly below minus this"
    )
    rises_rel: float | None = Field(
        None,
        description="crossed when that CI lies wholly above this share of the first "
        "evaluation's mean (a threshold relative to the base: saturation, contrast)",
    )
    falls_rel: float | None = Field(
        None, description="crossed when that CI lies wholly below minus this share of it"
    )
    above: float | None = Field(
        None, description="crossed when the evaluation's mean is above this"
    )
    below: float | None = Field(
        None, description="crossed when the evaluation's mean is below this"
    )

    @model_validator(mode="after")
    def _one_test(self):
        given = [t for t in _TESTS if getattr(self, t) is not None]
        if len(given) != 1:
            raise ValueError(
                f"train.guard.rules[{self.signal!r}]: give exactly one of {', '.join(_TESTS)} "
                f"(got {', '.join(given) or 'none'})"
            )
        return self

    @property
    def test(self) -> str:
        """The one test given: rises_by, falls_by, rises_rel, falls_rel, above or below."""
        return next(t for t in _TESTS if getattr(self, t) is not None)

    @property
    def threshold(self) -> float:
        return getattr(self, self.test)

    def describe(self) -> str:
        return f"{self.signal} {self.test.replace('_', ' ')} {self.threshold:g}"


class GuardConfig(Section):
    """``train.guard``: off by default; ``alert`` says so once any rule has been crossed at
    ``patience`` evaluations in a row and keeps the last healthy checkpoint; ``stop`` also
    ends the run (checkpointed, exported and evaluated as a finished run,
    ``finished.json`` reason ``guard``)."""

    action: Literal["off", "alert", "stop"] = Field(
        "off",
        description="alert: once a rule holds at `patience` evaluations in a row, say so (log, "
        "guard/tripped row, g2rpo_train_guard{stat=tripped}) and keep the last healthy "
        "checkpoint (healthy.json; `g2rpo export RUN --checkpoint healthy`), training on; "
        "stop: the same, then end the run",
    )
    patience: int = Field(2, ge=1, description="consecutive evaluations a rule must be crossed at")
    rules: list[GuardRule] | None = Field(
        None,
        description="the rules; left out, those calibrated for train.image_size "
        "(common/config/guard_defaults.py, filled in by the train section)",
    )
