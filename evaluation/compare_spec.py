"""A comparison's spec (YAML, ``--set`` overrides as ``train``): methods × seeds from
one base config, a budget in training NFEs or iterations, and how the trained
models are evaluated. Every run's config is resolved and validated up front."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from ..common.config import (
    ConfigError,
    G2RPOConfig,
    apply_override,
    load_config,
    yaml_problem,
)
from ..common.config_train import Section
from ..common.paths import resolve_path

CONTROL = "algorithm.control=true"


class MethodSpec(Section):
    set: list[str] = Field(default_factory=list, description="overrides of this method")
    label: str | None = Field(None, description="name in tables and plots")
    control_of: str | None = Field(
        None,
        description="the shuffled-advantage control of this method: its overrides, then "
        "this one's, then algorithm.control=true",
    )


class BudgetSpec(Section):
    nfe: int | None = Field(None, ge=1, description="training NFEs per run (equal compute)")
    iterations: int | None = Field(None, ge=1, description="iterations per run")
    also_at_iterations: int | None = Field(
        None, ge=1, description="also evaluate every run's checkpoint after this iteration"
    )
    curve_at_nfe: list[int] = Field(
        default_factory=list,
        description="also read every run's training-time held-out evaluations at these "
        "training NFEs (an earlier budget inside a longer run)",
    )

    @model_validator(mode="after")
    def _one(self) -> BudgetSpec:
        if (self.nfe is None) == (self.iterations is None):
            raise ValueError("give exactly one of nfe and iterations")
        if any(k < 1 for k in self.curve_at_nfe):
            raise ValueError(f"curve_at_nfe: every mark must be ≥ 1, got {self.curve_at_nfe}")
        if self.nfe is not None and any(k > self.nfe for k in self.curve_at_nfe):
            # no run reaches it: a run stops at its budget
            raise ValueError(
                f"curve_at_nfe: every mark must be ≤ nfe ({self.nfe}), got {self.curve_at_nfe}"
            )
        return self


class EvalOptions(Section):
    splits: list[str] = Field(default_factory=lambda: ["held_out", "train"])
    prompts_per_split: int = Field(40, ge=1)
    samples_per_prompt: int = Field(8, ge=1)
    seed: int = 10_000
    threads: int | None = Field(
        None,
        ge=1,
        description="torch CPU threads for the evaluation (1 when runs train beside it: "
        "oversubscribed cores make CPU sampling several times slower)",
    )


class CompareSpec(Section):
    name: str
    output_dir: str = "runs/compare"
    base_config: str = Field("configs/tiny.yaml", description="every run starts from it")
    set: list[str] = Field(default_factory=list, description="overrides for every run")
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    methods: dict[str, MethodSpec] = Field(min_length=1)
    budget: BudgetSpec
    eval: EvalOptions = Field(default_factory=EvalOptions)
    parallel: int = Field(1, ge=1, description="runs at once (a cluster with room)")
    reference: str | None = Field(
        None, description="the method others are compared with in pairs (default: the first)"
    )

    @model_validator(mode="after")
    def _names(self) -> CompareSpec:
        for name in self.methods:
            if not name.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"methods: name {name!r} must be letters, digits, - or _")
        if self.reference is not None and self.reference not in self.methods:
            raise ValueError(f"reference {self.reference!r} is not one of the methods")
        for name, m in self.methods.items():
            if m.control_of is None:
                continue
            target = self.methods.get(m.control_of)
            if target is None or target.control_of is not None:
                raise ValueError(
                    f"methods.{name}.control_of: {m.control_of!r} is not one of the methods "
                    "without a control_of of its own"
                )
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds has duplicates: {self.seeds}")
        return self

    def method_overrides(self, method: str) -> list[str]:
        """The method's own overrides; a control's are its method's, its own, and CONTROL."""
        m = self.methods[method]
        if m.control_of is None:
            return list(m.set)
        return [*self.methods[m.control_of].set, *m.set, CONTROL]

    @property
    def root(self) -> Path:
        return Path(self.output_dir) / self.name

    def reference_method(self) -> str:
        return self.reference or next(iter(self.methods))

    def label(self, method: str) -> str:
        return self.methods[method].label or method


@dataclass(frozen=True)
class PlannedRun:
    method: str
    seed: int
    name: str
    config: G2RPOConfig

    @property
    def run_dir(self) -> Path:
        return Path(self.config.run.output_dir) / self.config.run.name


def load_spec(path: str | Path, overrides: list[str] | None = None) -> CompareSpec:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"compare spec not found: {path}")
    try:
        data: Any = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    for assignment in overrides or []:
        apply_override(data, assignment)
    try:
        return CompareSpec.model_validate(data)
    except ValidationError as err:
        lines = [
            f"  {'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in err.errors()
        ]
        raise ConfigError(f"{path}: invalid compare spec:\n" + "\n".join(lines)) from None


def plan_runs(spec: CompareSpec) -> list[PlannedRun]:
    """Every (method, seed) run's resolved config; a bad override names the method."""
    b = spec.budget
    budget = [f"run.nfe_budget={b.nfe}", "run.iterations=100000"] if b.nfe else []
    if b.iterations:
        budget = [f"run.iterations={b.iterations}", "run.nfe_budget=null"]
    pinned = [f"train.checkpoints.at=[{b.also_at_iterations}]"] if b.also_at_iterations else []
    runs = []
    for method in spec.methods:
        for seed in spec.seeds:
            name = f"{method}-s{seed}"
            overrides = [
                *spec.set,
                *spec.method_overrides(method),
                f"run.seed={seed}",
                f"run.name={name}",
                f"run.output_dir={spec.root / 'runs'}",
                *budget,
                *pinned,
            ]
            try:
                cfg = load_config(resolve_path(spec.base_config), overrides)
            except ConfigError as exc:
                raise ConfigError(f"methods.{method} (seed {seed}): {exc}") from None
            runs.append(PlannedRun(method, seed, name, cfg))
    return runs
