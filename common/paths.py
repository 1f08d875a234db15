"""Where a relative model or prompt path is looked up."""

from __future__ import annotations

from pathlib import Path


def resolve_path(path: str) -> Path:
    """Relative model paths resolve against the working dir, then the repository."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    repo = Path(__file__).resolve().parents[1] / p
    return repo if repo.exists() else p
