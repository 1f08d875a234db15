"""Prompt lists: the shapes world's splits by name, or a text file (one per line)."""

from __future__ import annotations

from pathlib import Path

SHAPES_SPLITS = ("shapes:train", "shapes:held_out")


def read_prompts(spec: str, field: str) -> list[str]:
    """``shapes:train``, ``shapes:held_out`` or a file; errors name ``field``."""
    if spec in SHAPES_SPLITS:
        from .shapes import split_combinations

        train, held = split_combinations()
        return [s.prompt for s in (train if spec == "shapes:train" else held)]
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"{field}: {spec!r} is neither {' nor '.join(SHAPES_SPLITS)} nor a file")
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"{field}: {spec} holds no prompts")
    return lines
