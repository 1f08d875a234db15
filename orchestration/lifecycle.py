"""A training session's start and end around the loop: opening (or resuming) a run
directory, loading the last checkpoint, attaching telemetry, which iterations end with a
checkpoint or end a session short, and marking a run finished with its final weights and
their evaluation."""

from __future__ import annotations

import sys
from pathlib import Path

from ..common.config.diff import config_differences
from ..common.config.loading import dump_config, load_config
from ..common.config.run import G2RPOConfig
from ..common.errors import ConfigError, RunDirError
from ..run_directory.files import (
    CKPT,
    checkpoint_to_resume,
    export_final,
    finished,
    mark_finished,
    read_evaluations,
    read_metrics,
    truncate_metrics,
)
from ..run_directory.healthy import note_guard_reading
from .budget import Budget
from .scratch_dirs import ray_owned_problem


def open_run(config, overrides, resume) -> tuple[G2RPOConfig, Path]:
    # absolute: the learner ranks write checkpoints and the export at this path from
    # their own working directories, on their own nodes (shared_dir.py checks it)
    if resume is not None:
        run_dir = Path(resume).absolute()
        if not (run_dir / "config.yaml").is_file():
            raise RunDirError(f"--resume {run_dir}: no config.yaml there (not a run directory)")
        cfg = load_config(run_dir / "config.yaml", overrides)
        _refuse_ray_owned(run_dir, str(resume))
        return cfg, run_dir
    cfg = load_config(config, overrides)
    run_dir = (Path(cfg.run.output_dir) / cfg.run.name).absolute()
    _refuse_ray_owned(run_dir, cfg.run.output_dir)
    if (run_dir / "metrics.jsonl").exists():
        raise RunDirError(
            f"{run_dir} already holds a run: pass --resume {run_dir} or another run.name"
        )
    (run_dir / CKPT).mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    return cfg, run_dir


def _refuse_ray_owned(run_dir: Path, output_dir: str) -> None:
    problem = ray_owned_problem(run_dir, output_dir)
    if problem is not None:
        raise RunDirError(problem)


def run_to_continue(config, overrides) -> Path | None:
    """``--resume-or-start``: the run directory ``config`` names when it already holds
    a run (then it resumes, on the config it recorded, as ``--resume`` does), else None
    (it starts). A field whose recorded value differs from ``config``'s is named, since
    the recorded one wins."""
    cfg = load_config(config, overrides)
    run_dir = (Path(cfg.run.output_dir) / cfg.run.name).absolute()
    if not (run_dir / "config.yaml").is_file():
        return None
    recorded = load_config(run_dir / "config.yaml", overrides)
    changed = [
        path
        for path, _, _ in config_differences(
            recorded.model_dump(mode="json"), cfg.model_dump(mode="json")
        )
    ]
    print(f"{run_dir} holds a run: resuming it", file=sys.stderr)
    if changed:
        print(
            f"  {config} differs from the run's config.yaml in {', '.join(changed)}: the "
            "run's own values are kept (give --set FIELD=VALUE to change one on resume)",
            file=sys.stderr,
        )
    return run_dir


def nothing_left(cfg: G2RPOConfig, run_dir: Path) -> bool:
    """A finished run resumed with nothing more to do (no more iterations and no
    larger NFE budget than the one it spent), whose final weights and their
    evaluation are written: answered from the run directory, before any actor starts."""
    done = finished(run_dir)
    rows = read_metrics(run_dir) if done is not None else []
    if not rows:
        return False
    last = rows[-1]["iteration"] + 1
    if last > cfg.run.iterations:
        return False  # resume_point says why that cannot be resumed
    if last < cfg.run.iterations:
        if done["reason"] == "guard":
            if cfg.train.guard.action != "stop":
                return False  # resumed with the guard off: it trains on
        elif done["reason"] != "nfe_budget":
            return False
        else:
            spent = Budget(cfg.run.nfe_budget, rows[-1]["nfe_train_total"], rows[-1]["nfe_train"])
            if not spent.exhausted():
                return False
    return (run_dir / "final").is_dir() and (run_dir / "evals" / f"it_{last:05d}.json").is_file()


def resume_point(loop) -> int:
    """Load the last checkpoint; keep the metrics and evaluations before it. A run
    whose recorded checkpoint is missing stops here, its record untouched
    (``checkpoint_to_resume``)."""
    cfg, run_dir = loop.cfg, loop.run_dir
    ckpt = checkpoint_to_resume(run_dir)
    start = loop.actors.learner.load(str(ckpt)) if ckpt is not None else 0
    if start > cfg.run.iterations:
        raise ConfigError(
            f"run.iterations={cfg.run.iterations}: the run's checkpoint is already at "
            f"iteration {start}; resume with --set run.iterations=N for N >= {start}"
        )
    rows = truncate_metrics(run_dir, start)
    loop.guard.replay(rows)
    if rows:
        loop.budget.total = rows[-1].get("nfe_train_total", 0)
        loop.budget.last = rows[-1].get("nfe_train", 0)
        loop.learner_restarts = rows[-1].get("learner_restarts", 0)
    evaluations = read_evaluations(run_dir)
    loop.first_eval = evaluations[0] if evaluations else None
    loop.last_eval_nfe = evaluations[-1]["nfe_train_total"] if evaluations else None
    return start


def attach_telemetry(loop) -> None:
    if loop.cfg.train.metrics.port is not None:
        from .telemetry import TrainingExporter

        loop.exporter = TrainingExporter(loop.cfg.train.metrics.port, loop.cfg.train.metrics.host)
        (loop.run_dir / "metrics_port").write_text(f"{loop.exporter.port}\n")
    if loop.actors.rewards.redis_url:
        from .telemetry import RedisStatus

        rewards = loop.actors.rewards  # the password as the driver read it: in memory
        loop.status = RedisStatus(rewards.redis_url, loop.cfg.run.name, rewards.redis_password)


def finish(loop, start: int, done: int) -> None:
    """A finished run (all iterations, or its NFE budget spent) exports its weights
    to final/ (or replaces them, when this session trained further) and says so."""
    cfg, run_dir = loop.cfg, loop.run_dir
    if done >= cfg.run.iterations:
        reason = "iterations"
    elif loop.budget.exhausted():
        reason = "nfe_budget"
    elif loop.guard.stops:
        reason = "guard"
        print(loop.guard.message(), file=sys.stderr)
    else:
        return  # stopped by --max-iterations: resumable, not finished
    if done > start or not (run_dir / "final").exists():
        loop.at("export", done)
        export_final(loop.actors.learner, run_dir)
    if done > start or not (run_dir / "evals" / f"it_{done:05d}.json").exists():
        loop.at("final_evaluation", done)
        _evaluate_final(loop, done)
    loop.at("finished", done)
    mark_finished(run_dir, reason, done, loop.budget.total)


def _evaluate_final(loop, done: int) -> None:
    """The trained weights' own evaluation (evals/it_<done>.json), so that the
    reward-vs-NFE curve ends at the run's last NFE, read by train.guard as the others."""
    weights = loop.publish()
    pending = loop.evaluate(done, weights, forced=True)
    row = {"iteration": done, **loop.collect_evaluation(pending)}
    # train.guard reads it too (no metrics row holds it: its reading goes to its record)
    note_guard_reading(loop.run_dir, {**row, **loop.guard.observe(row)}, loop.guard.tripped)


def checkpoint_due(done: int, since_s: float, checkpoints) -> bool:
    """Whether the iteration that made ``done`` iterations ends with a checkpoint
    (``train.checkpoints``): every N iterations, at the pinned ones, and once
    ``every_minutes`` of wall time passed since the last checkpoint (or the session's
    start), so a lost node costs at most that much whatever an iteration takes."""
    minutes = checkpoints.every_minutes
    return (
        done % checkpoints.every == 0
        or done in checkpoints.at
        or (minutes is not None and since_s >= 60.0 * minutes)
    )


def stops_short(it: int, end: int, iterations: int) -> bool:
    """Iteration ``it`` ends a session (``end``: the first it does not run) that leaves
    the run unfinished (of ``iterations``): no final evaluation follows it."""
    return it == end - 1 and end < iterations
