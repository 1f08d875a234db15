"""A comparison's spec (YAML, ``--set`` overrides as ``train``): methods × seeds from
one base config, a budget in training NFEs or iterations, and how the trained
models are evaluated. Every run's config is resolved and validated up front.

A method may start from another's overrides instead of repeating them: ``extends:
mixgrpo`` (a method of this spec) or ``extends: methods.yaml#mixgrpo`` (a method of
another spec, the file found beside this one), then its own ``set`` on top, so one
method's settings live in one place and a sweep only says what it changes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, PrivateAttr, ValidationError, model_validator

from ..common.config.loading import apply_override, load_config, yaml_problem
from ..common.config.run import G2RPOConfig
from ..common.config.section import Section
from ..common.errors import ConfigError
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
    extends: str | None = Field(
        None,
        description="start from this method's overrides, then this one's: a method of this "
        "spec, or FILE#METHOD for one of another spec beside this one",
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
    # FILE#METHOD -> that method's overrides, read by load_spec
    _other_specs: dict[str, list[str]] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _names(self) -> CompareSpec:
        for name in self.methods:
            if not name.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"methods: name {name!r} must be letters, digits, - or _")
        if self.reference is not None and self.reference not in self.methods:
            raise ValueError(f"reference {self.reference!r} is not one of the methods")
        for name, m in self.methods.items():
            if m.control_of is not None and m.extends is not None:
                raise ValueError(
                    f"methods.{name}: give one of control_of and extends (a control "
                    "already starts from its method's overrides)"
                )
            for field, target in (("control_of", m.control_of), ("extends", m.extends)):
                if target is None or (field == "extends" and _other_spec(target)):
                    continue
                if target not in self.methods or target == name:
                    raise ValueError(
                        f"methods.{name}.{field}: {target!r} is not one of the other methods"
                    )
            self._inheritance_chain(name)  # refuses a loop
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds has duplicates: {self.seeds}")
        return self

    def _inheritance_chain(self, method: str) -> list[str]:
        """The methods of this spec whose overrides `method` starts from, nearest first."""
        chain, current = [], self.methods[method]
        while True:
            parent = current.control_of or current.extends
            if parent is None or _other_spec(parent):
                return chain
            if parent == method or parent in chain:
                loop = " -> ".join([method, *chain, parent])
                raise ValueError(f"methods.{method}: control_of/extends go round in a loop: {loop}")
            chain.append(parent)
            current = self.methods[parent]

    def method_overrides(self, method: str) -> list[str]:
        """The method's overrides: those it extends (or, for a control, its method's),
        then its own, then for a control CONTROL."""
        m = self.methods[method]
        if m.control_of is not None:
            return [*self.method_overrides(m.control_of), *m.set, CONTROL]
        if m.extends is None:
            return list(m.set)
        if _other_spec(m.extends):
            if m.extends not in self._other_specs:
                raise ConfigError(
                    f"methods.{method}.extends: {m.extends!r} is in another spec, which "
                    "only load_spec reads"
                )
            return [*self._other_specs[m.extends], *m.set]
        return [*self.method_overrides(m.extends), *m.set]

    def is_control(self, method: str) -> bool:
        return CONTROL in self.method_overrides(method)

    def record(self) -> dict:
        """The spec as written plus every method's resolved overrides, so a record of a
        method that extends another spec's still says what it ran."""
        data = self.model_dump(mode="json")
        data["method_overrides"] = {m: self.method_overrides(m) for m in self.methods}
        return data

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


def _other_spec(extends: str) -> bool:
    return "#" in extends


def load_spec(
    path: str | Path, overrides: list[str] | None = None, _reading: tuple[Path, ...] = ()
) -> CompareSpec:
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
        spec = CompareSpec.model_validate(data)
    except ValidationError as err:
        lines = [
            f"  {'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in err.errors()
        ]
        raise ConfigError(f"{path}: invalid compare spec:\n" + "\n".join(lines)) from None
    _read_other_specs(spec, path, (*_reading, path.resolve()))
    for name, m in spec.methods.items():
        if m.control_of is not None and spec.is_control(m.control_of):
            raise ConfigError(
                f"{path}: methods.{name}.control_of: {m.control_of!r} is itself a control"
            )
    return spec


def _read_other_specs(spec: CompareSpec, path: Path, reading: tuple[Path, ...]) -> None:
    """Each FILE#METHOD that a method extends, as that method's overrides (each file read
    once, however many methods extend it)."""
    read: dict[Path, CompareSpec] = {}
    for name, m in spec.methods.items():
        if m.extends is None or not _other_spec(m.extends):
            continue
        file, _, method = m.extends.partition("#")
        where = f"{path}: methods.{name}.extends: {m.extends!r}"
        other_path = path.parent / file
        if not file or not method:
            raise ConfigError(f"{where}: write FILE#METHOD, e.g. methods.yaml#mixgrpo")
        if not other_path.is_file():
            raise ConfigError(f"{where}: no spec {other_path}")
        key = other_path.resolve()
        if key in reading:
            raise ConfigError(f"{where}: the specs extend each other in a loop")
        if key not in read:
            try:
                read[key] = load_spec(other_path, _reading=reading)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
        other = read[key]
        if method not in other.methods:
            raise ConfigError(
                f"{where}: {other_path} has no method {method!r} (it has: "
                f"{', '.join(other.methods)})"
            )
        spec._other_specs[m.extends] = other.method_overrides(method)


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
