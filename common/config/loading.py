"""Loading a run config: YAML, ``a.b=c`` overrides, and validation
errors that name the dotted field and its value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..errors import ConfigError
from ..paths import config_candidates, find_config
from .run import G2RPOConfig


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
