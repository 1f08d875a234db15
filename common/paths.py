"""Where a relative model, prompt or config path is looked up.

The committed world (``assets/``) and the recipes (``configs/``) sit beside the code's
folders: at the top of a checkout, and inside the installed package (pyproject ships
them as package data, ``site-packages/g2rpo/assets`` and ``g2rpo/configs``). So one
root, the folder that holds ``common/``, finds them in both: a relative path is tried
in the working dir first, then under that root."""

from __future__ import annotations

from pathlib import Path

# The checkout's root, or the installed ``g2rpo`` package (common/ is g2rpo/common there).
PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHIPPED_CONFIGS = PROJECT_ROOT / "configs"
# The committed tiny shapes world (reproducible by `g2rpo pretrain`, see its world.json).
DEFAULT_WORLD = PROJECT_ROOT / "assets" / "shapes-world"


def resolve_path(path: str | Path) -> Path:
    """A relative path as given when it exists from the working dir, else under the
    project root when it exists there, else unchanged (the caller reports it)."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    shipped = PROJECT_ROOT / p
    return shipped if shipped.exists() else p


def config_candidates(path: str | Path) -> list[Path]:
    """Where a config file is looked for, in order: as given (the working dir), under
    the project root (``configs/tiny.yaml``), among the shipped configs (``tiny.yaml``)."""
    p = Path(path)
    if p.is_absolute():
        return [p]
    return [p, PROJECT_ROOT / p, SHIPPED_CONFIGS / p]


def find_config(path: str | Path) -> Path | None:
    """The first config file of :func:`config_candidates` that exists, or None."""
    return next((c for c in config_candidates(path) if c.is_file()), None)
