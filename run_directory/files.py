"""A run directory's files: metrics.jsonl, evaluations, checkpoints (with
retention), the final export, sample grids, curves and the finished marker."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

from ..common.config.run import G2RPOConfig
from ..common.errors import RunDirError
from ..learner.checkpoints import PARTIAL, SHARDED_SUFFIX, complete

CKPT = "checkpoints"
CHECKPOINT_INDEX = "checkpoints.jsonl"  # the driver's record of the checkpoints it saw written
FINISHED = "finished.json"


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def iteration_of(path: Path) -> int:
    """N of a run file named ``it_NNNNN.<ext>`` (checkpoints, evaluations, sample grids,
    an evaluation's kept images ``it_NNNNN.images.npz``)."""
    return int(path.name[3:].split(".")[0])


def append_metrics(run_dir: Path, row: dict) -> None:
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")


def truncate_metrics(run_dir: Path, start: int) -> list[dict]:
    """Keep the rows of iterations before ``start`` (a resume redoes the rest)."""
    path = run_dir / "metrics.jsonl"
    rows = [r for r in (read_metrics(run_dir) if path.exists() else []) if r["iteration"] < start]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for stale in (run_dir / "evals").glob("it_*.json"):
        if iteration_of(stale) >= start:
            stale.unlink()
    (run_dir / FINISHED).unlink(missing_ok=True)
    return rows


def write_json_atomic(path: Path, data) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def record_values(record: dict) -> dict:
    """Every per-sample value of a saved evaluation record (evals/it_N.json): its
    scores, and its image-health measures as ``health/<measure>`` ({name: float64 [N]})."""
    import numpy as np

    values = {k: np.asarray(v, dtype=np.float64) for k, v in record["scores"].items()}
    for k, v in record.get("health", {}).items():
        values["health/" + k] = np.asarray(v, dtype=np.float64)
    return values


def save_evaluation(run_dir: Path, iteration: int, record: dict) -> None:
    """Per-sample eval scores of one iteration (the report and compare read them)."""
    (run_dir / "evals").mkdir(exist_ok=True)
    write_json_atomic(run_dir / "evals" / f"it_{iteration:05d}.json", record)


def read_evaluations(run_dir: str | Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(run_dir).glob("evals/it_*.json"))]


def checkpoint_path(run_dir: Path, done: int, sharded: bool = False) -> Path:
    """``it_NNNNN.pt`` (one file), or ``it_NNNNN.dcp/`` for a sharded learner group."""
    return run_dir / CKPT / f"it_{done:05d}{SHARDED_SUFFIX if sharded else '.pt'}"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """The run's complete checkpoints of either layout, oldest iteration first."""
    found = [
        p
        for p in (run_dir / CKPT).glob("it_*")
        if p.suffix in (".pt", SHARDED_SUFFIX) and complete(p)
    ]
    return sorted(found, key=iteration_of)


def latest_checkpoint(run_dir: Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def record_checkpoint(run_dir: Path, path: Path) -> None:
    """Note in the run's record that the checkpoint at ``path`` was written and seen
    whole by the driver: a resume must then find it (or a newer one)."""
    entry = {"iteration": iteration_of(path), "path": str(path.relative_to(run_dir))}
    with (run_dir / CHECKPOINT_INDEX).open("a") as f:
        f.write(json.dumps(entry) + "\n")


def recorded_checkpoints(run_dir: Path) -> list[dict]:
    path = run_dir / CHECKPOINT_INDEX
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def checkpoint_to_resume(run_dir: Path) -> Path | None:
    """The checkpoint a resume loads: the newest complete one. A run whose record
    (``checkpoints.jsonl``) names a newer checkpoint than any found here is not
    resumed from an older one (nor from nothing, which would drop the whole record):
    RunDirError says which checkpoint is missing, and nothing is changed."""
    found = latest_checkpoint(run_dir)
    recorded = recorded_checkpoints(run_dir)
    if not recorded:
        return found
    newest = max(recorded, key=lambda e: e["iteration"])
    if found is not None and iteration_of(found) >= newest["iteration"]:
        return found
    here = ", ".join(p.name for p in list_checkpoints(run_dir)) or "none"
    raise RunDirError(
        f"{run_dir}: the run recorded a checkpoint at iteration {newest['iteration']} "
        f"({newest['path']}), but it is not there (complete checkpoints found: {here}); "
        "not resumed, and metrics.jsonl and evals/ are left as they are. Were the "
        "checkpoints written on another filesystem than the one this driver sees "
        "(run.output_dir must be shared by the driver and every node)? Restore the "
        f"checkpoint, or remove the lines after iteration {iteration_of(found) if found else -1} "
        f"from {CHECKPOINT_INDEX} to resume from what is here"
    )


def remove_checkpoint(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def replace_other_layout(run_dir: Path, done: int, sharded: bool) -> None:
    """A run resumed with another number of learners writes the other layout: drop
    the stale checkpoint of the same iteration so only one is ever found."""
    remove_checkpoint(checkpoint_path(run_dir, done, not sharded))


def incomplete_checkpoints(run_dir: Path) -> list[Path]:
    """What a crash mid-save leaves: ``.partial`` directories, and sharded ones
    without their marker."""
    found = []
    for p in (run_dir / CKPT).glob("it_*"):
        if p.name.endswith(PARTIAL) or (p.suffix == SHARDED_SUFFIX and not complete(p)):
            found.append(p)
    return sorted(found)


def prune_checkpoints(run_dir: Path, cfg: G2RPOConfig, also_keep: Path | None = None) -> list[Path]:
    """Delete what a crashed save left, and periodic checkpoints beyond the newest
    ``train.checkpoints.keep``; those named in ``train.checkpoints.at`` stay, and
    ``also_keep`` (train.guard's healthy one, ``run_directory/healthy.py``)."""
    leftovers = incomplete_checkpoints(run_dir)
    for p in leftovers:
        remove_checkpoint(p)
    keep = cfg.train.checkpoints.keep
    if keep is None:
        return leftovers
    pinned = set(cfg.train.checkpoints.at)
    periodic = [p for p in list_checkpoints(run_dir) if iteration_of(p) not in pinned]
    doomed = [p for p in periodic[:-keep] if p != also_keep]
    for p in doomed:
        remove_checkpoint(p)
    return leftovers + doomed


def mark_finished(run_dir: Path, reason: str, iterations: int, nfe_train_total: int) -> None:
    write_json_atomic(
        run_dir / FINISHED,
        {"reason": reason, "iterations": iterations, "nfe_train_total": nfe_train_total},
    )


def finished(run_dir: str | Path) -> dict | None:
    path = Path(run_dir) / FINISHED
    return json.loads(path.read_text()) if path.is_file() else None


def export_final(learner, run_dir: Path) -> None:
    """The trained weights in a diffusers layout under final/, written aside and
    swapped in, so a final/ that exists is always complete (``learner``: the
    learner group)."""
    final, partial, old = (run_dir / n for n in ("final", "final.partial", "final.old"))
    shutil.rmtree(partial, ignore_errors=True)
    learner.export(str(partial))
    if not partial.is_dir():  # written by learner rank 0, on its node
        raise RunDirError(
            f"run.output_dir: learner rank 0 exported the final weights to {partial}, but the "
            "driver does not see them there: the run directory must be one filesystem for "
            "the driver and every node"
        )
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    partial.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def grid_samples(num_samples: int, per_prompt: int) -> list[int]:
    """Which evaluation samples a sample grid shows: up to 8 prompts spread over the
    list × their first 4 samples (an evaluator sends back only these images)."""
    from .grids import spread_rows

    rows = spread_rows(num_samples // per_prompt, 8)
    k = min(per_prompt, 4)
    return [r * per_prompt + j for r in rows for j in range(k)]


def write_sample_grid(
    path: Path, shown: np.ndarray, prompts: list[str], per_prompt: int, title: str
) -> None:
    """Eval samples as a labelled grid; ``shown``: the images of ``grid_samples``, in
    its order (``prompts``: every sample's prompt)."""
    from .grids import labelled_grid, spread_rows

    distinct = prompts[::per_prompt]
    rows = spread_rows(len(distinct), 8)
    tiles = shown.reshape(len(rows), -1, *shown.shape[1:])
    labelled_grid(
        path, [distinct[r] for r in rows], [("samples (fixed noise)", tiles)], title=title
    )
    path.with_suffix(".txt").write_text("\n".join(distinct[r] for r in rows) + "\n")


def draw_curves(run_dir: Path, name: str) -> None:
    from .plots import plot_curves

    try:
        plot_curves(read_metrics(run_dir), run_dir / "curves.png", title=name)
    except Exception as exc:  # a picture must never end a run
        print(f"could not draw {run_dir / 'curves.png'}: {exc}", file=sys.stderr)
