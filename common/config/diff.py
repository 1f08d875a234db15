"""Where two resolved configs differ, field by field (a resumed run's recorded config
against the one it was given; a comparison's run on disk against its spec)."""

from __future__ import annotations

from typing import Any


def config_differences(a: dict, b: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted field path, value in ``a``, value in ``b``) for each leaf that differs,
    in field order; nested mappings are compared field by field."""
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += config_differences(va, vb, f"{prefix}{key}.")
        elif va != vb:
            out.append((f"{prefix}{key}", va, vb))
    return out
