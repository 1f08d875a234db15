"""Prompt lists: the shapes world's splits by name, or a text file (one per line)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import ConfigError

SHAPES_SPLITS = ("shapes:train", "shapes:held_out")


def read_prompts(spec: str, field: str) -> list[str]:
    """``shapes:train``, ``shapes:held_out`` or a file; errors name ``field``."""
    if spec in SHAPES_SPLITS:
        from .shapes import split_combinations

        train, held = split_combinations()
        return [s.prompt for s in (train if spec == "shapes:train" else held)]
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(f"{field}: {spec!r} is neither {' nor '.join(SHAPES_SPLITS)} nor a file")
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not lines:
        raise ConfigError(f"{field}: {spec} holds no prompts")
    return lines


def prompts_for(all_prompts: list[str], seed: int, iteration: int, count: int) -> list[str]:
    """The iteration's prompts: a seeded draw without replacement (stateless sampler)."""
    rng = np.random.default_rng([seed, iteration, 7])
    replace = count > len(all_prompts)
    return [all_prompts[i] for i in rng.choice(len(all_prompts), count, replace=replace)]
