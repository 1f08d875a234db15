"""``healthy.json``: the run's last evaluation at which ``train.guard`` crossed no rule,
and the checkpoint kept for it. Written at every healthy evaluation and when the guard
raises its alarm; pruning (``train.checkpoints.keep``) never deletes that checkpoint, so a
run that went on training after the alarm (``action: alert``) can still be rolled back:
``g2rpo export RUN --checkpoint healthy``."""

from __future__ import annotations

import json
from pathlib import Path

from .files import iteration_of, list_checkpoints, write_json_atomic

HEALTHY = "healthy.json"


def healthy_checkpoint(run_dir: Path, iteration: int) -> Path | None:
    """The newest checkpoint holding the weights an evaluation at ``iteration`` saw, or
    older ones (checkpoint it_N holds the weights after N updates, which iteration N
    evaluates): the newest with N ≤ ``iteration``."""
    older = [p for p in list_checkpoints(run_dir) if iteration_of(p) <= iteration]
    return older[-1] if older else None


def read_healthy(run_dir: str | Path) -> dict | None:
    path = Path(run_dir) / HEALTHY
    return json.loads(path.read_text()) if path.is_file() else None


def note_guard_reading(run_dir: Path, row: dict, tripped: dict | None) -> None:
    """After an evaluation's guard entries (``Guard.observe``): the reading joins the
    evaluation's record (evals/it_N.json ``guard``: the final evaluation has no metrics
    row); a healthy evaluation moves the mark forward; the alarm records itself beside the
    mark, once."""
    if "guard/crossed" not in row:
        return
    record_path = run_dir / "evals" / f"it_{row['iteration']:05d}.json"
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        record["guard"] = {k: v for k, v in row.items() if k.startswith("guard/")}
        write_json_atomic(record_path, record)
    known = read_healthy(run_dir) or {}
    if row["guard/crossed"] == 0 and "tripped" not in known:
        it = row["iteration"]
        ckpt = healthy_checkpoint(run_dir, it)
        known = {"iteration": it, "checkpoint": None if ckpt is None else ckpt.name}
    elif tripped is not None and "tripped" not in known:
        known = {**known, "tripped": tripped}
    else:
        return
    write_json_atomic(run_dir / HEALTHY, known)


def kept_for_health(run_dir: Path) -> Path | None:
    """The checkpoint pruning must keep (``prune_checkpoints(..., also_keep=)``): the one
    ``healthy.json`` names, if it exists. None too when the last healthy evaluation is the
    base's (iteration 0, before any checkpoint: its weights are model.pretrained's)."""
    known = read_healthy(run_dir)
    if not known or known.get("checkpoint") is None:
        return None
    path = run_dir / "checkpoints" / known["checkpoint"]
    return path if path.exists() else None
