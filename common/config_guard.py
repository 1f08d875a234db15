"""``train.guard``: stop a run that is hacking its reward, judged at each evaluation by
rules on its image-health measures and reward drift (``common/guard.py``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .config_section import Section

_TESTS = ("rises_by", "falls_by", "above", "below")


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

    def describe(self) -> str:
        test = next(t for t in _TESTS if getattr(self, t) is not None)
        return f"{self.signal} {test.replace('_', ' ')} {getattr(self, test):g}"


def default_rules() -> list[GuardRule]:
    """The hacking study's rules (docs/results/hacking: on its 8 runs they stop every run
    in which a person saw a hack and neither clean run; chosen after seeing all 8, so
    they are not held out): texture (high-frequency share, spectral peaks), the
    background, distance from the base, collapse, and the held-out reward falling while
    the trained one rises."""
    return [
        GuardRule(signal="health/high_freq", rises_by=0.02),
        GuardRule(signal="health/periodicity", rises_by=0.02),
        GuardRule(signal="health/background_shift", rises_by=0.05),
        GuardRule(signal="health/base_distance", rises_by=0.07),
        GuardRule(signal="health/diversity", falls_by=0.03),
        GuardRule(signal="drift/diverging", above=0.5),
    ]


class GuardConfig(Section):
    """``train.guard``: off by default; ``stop`` ends the run (checkpointed, exported and
    evaluated as a finished run, ``finished.json`` reason ``guard``) once any rule has
    been crossed at ``patience`` evaluations in a row."""

    action: Literal["off", "stop"] = "off"
    patience: int = Field(2, ge=1, description="consecutive evaluations a rule must be crossed at")
    rules: list[GuardRule] = Field(default_factory=default_rules)
