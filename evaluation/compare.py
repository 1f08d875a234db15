"""``g2rpo compare SPEC``: train every (method, seed) run through ``g2rpo train``
(the same Ray path; one after another, or ``parallel`` at once where a cluster has
room; or one after another in this process through a ``train_one`` the caller
gives, such as orchestration's warm-actor trainer), resume an interrupted comparison
(finished runs are skipped, partial ones resumed), evaluate every trained model
against the base on fixed noise, and write results.json, table.md, curves and
side-by-side grids."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tqdm.auto import tqdm

from ..common.config.diff import config_differences
from ..common.config.loading import dump_config, load_config
from ..common.errors import ConfigError, G2RPOError, RunDirError, RunFailed, UsageError
from ..common.paths import resolve_path
from ..run_directory.files import finished, read_metrics
from .compare_spec import CompareSpec, PlannedRun, plan_runs
from .eval_outputs import eval_summary, write_eval_outputs
from .evaluate import EvalSettings, SplitSamples, evaluate_policy
from .metrics import make_scorers
from .policy import PolicySource, load_policy, resolve_policy
from .run_claims import claim, held_elsewhere, release


class SpecChanged(ValueError):
    """A run on disk was made from different settings than the spec now gives."""


# where a run lives, not how it trains: a finished run copied from another comparison
# (same settings and seed) counts as this comparison's run
_PLACE = ("name", "output_dir")  # of run


def check_unchanged(run: PlannedRun) -> None:
    on_disk = run.run_dir / "config.yaml"
    if not on_disk.is_file():
        return
    old, new = (c.model_dump(mode="json") for c in (load_config(on_disk), run.config))
    for dump in (old, new):
        for key in _PLACE:
            del dump["run"][key]
    diff = [
        f"{path}: {va!r} on disk, {vb!r} in the spec"
        for path, va, vb in config_differences(old, new)
    ]
    if diff:
        raise SpecChanged(
            f"run {run.name} ({run.run_dir}) was trained with other settings: "
            + "; ".join(diff[:5])
            + " — delete that run directory or give the comparison another name"
        )


def _resume_dir(run: PlannedRun) -> Path | None:
    """The run's directory when it has started (metrics on disk): it is resumed."""
    return run.run_dir if (run.run_dir / "metrics.jsonl").exists() else None


def _train_command(run: PlannedRun, config_path: Path) -> list[str]:
    from ..reward_server.process import g2rpo_executable

    exe = [g2rpo_executable(), "train", "--no-progress"]
    resume = _resume_dir(run)
    if resume is not None:
        return [*exe, "--resume", str(resume)]
    return [*exe, "--config", str(config_path)]


def _progress_of(run: PlannedRun) -> str:
    try:
        rows = read_metrics(run.run_dir)
    except (OSError, ValueError):
        return ""
    if not rows:
        return ""
    last, budget = rows[-1], run.config.run.nfe_budget
    share = f"{last['nfe_train_total'] / budget:.0%} NFE" if budget else ""
    return f"{run.name} it {last['iteration'] + 1} {share}".strip()


# trains a run in this process from its config file, or resumes the run directory
# given (then the config file is the one it was started with), raising a G2RPOError
# when the run cannot go on
TrainOne = Callable[[Path, Path | None], None]


def _train_here(run: PlannedRun, config_path: Path, train_one: TrainOne) -> str | None:
    """Train (or resume) one run in this process through ``train_one``, its output
    appended to <run>/train.log as a ``g2rpo train`` process's would be; returns
    what failed, or None."""
    with (
        (run.run_dir / "train.log").open("a") as log,
        contextlib.redirect_stdout(log),
        contextlib.redirect_stderr(log),
    ):
        try:
            train_one(config_path, _resume_dir(run))
        except G2RPOError as e:  # as `g2rpo train` reports it; anything else is a bug
            print(f"g2rpo: error: {e}", file=log)
            return f"{run.name} ({e}; see {run.run_dir}/train.log)"
        rows = len(read_metrics(run.run_dir))
        print(f"run {run.run_dir}: {rows} iterations in metrics.jsonl (compare --in-process)")
    if finished(run.run_dir) is None:
        return f"{run.name} (stopped before its budget; see {run.run_dir}/train.log)"
    return None


def train_runs(
    spec: CompareSpec,
    runs: list[PlannedRun],
    progress: bool = True,
    *,
    train_one: TrainOne | None = None,
) -> None:
    """Train the runs not finished yet; each logs to <run>/train.log. Each goes
    through its own ``g2rpo train`` process, or, given ``train_one``, through this
    process, one after another."""
    todo = [r for r in runs if finished(r.run_dir) is None]
    configs = spec.root / "configs"
    configs.mkdir(parents=True, exist_ok=True)
    bar = tqdm(
        total=len(runs), initial=len(runs) - len(todo), desc="compare runs", disable=not progress
    )
    running: list[tuple[PlannedRun, subprocess.Popen]] = []
    failed: list[str] = []
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    queue = list(todo)
    elsewhere: list[PlannedRun] = []  # being trained by another compare process
    try:
        while queue or running or elsewhere:
            for run in list(elsewhere):
                if finished(run.run_dir) is not None:
                    elsewhere.remove(run)
                    bar.update(1)
                elif not held_elsewhere(run.run_dir):  # that process stopped: take it over
                    elsewhere.remove(run)
                    queue.append(run)
            while queue and len(running) < spec.parallel:
                run = queue.pop(0)
                if finished(run.run_dir) is not None:  # another compare process trained it
                    bar.update(1)
                    continue
                if not claim(run.run_dir):
                    elsewhere.append(run)
                    continue
                path = configs / f"{run.name}.yaml"
                path.write_text(dump_config(run.config))
                if train_one is not None:
                    bar.set_postfix_str(f"{run.name} (in this process)")
                    try:
                        error = _train_here(run, path, train_one)
                    finally:
                        release(run.run_dir)
                    failed += [error] if error else []
                    bar.update(1)
                    continue
                log = (run.run_dir / "train.log").open("a")
                # a session of its own: a terminal's Ctrl-C reaches this process only,
                # which stops each run once (a second SIGINT could cut its checkpoint)
                proc = subprocess.Popen(
                    _train_command(run, path),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
                running.append((run, proc))
            if running:  # back as soon as the oldest run ends, or in 2 s to update the bar
                with contextlib.suppress(subprocess.TimeoutExpired):
                    running[0][1].wait(timeout=2.0)
            elif elsewhere:
                time.sleep(2.0)
            for run, proc in list(running):
                if proc.poll() is None:
                    continue
                running.remove((run, proc))
                release(run.run_dir)
                bar.update(1)
                if proc.returncode != 0 or finished(run.run_dir) is None:
                    failed.append(
                        f"{run.name} (exit {proc.returncode}, see {run.run_dir}/train.log)"
                    )
            bar.set_postfix_str(", ".join(_progress_of(r) for r, _ in running))
    except KeyboardInterrupt:
        for _, proc in running:
            # SIGTERM, which `g2rpo train` takes as Ctrl-C (and a run started by a
            # background compare cannot ignore): each checkpoints and can be resumed
            proc.send_signal(signal.SIGTERM)
        for run, proc in running:
            try:
                code = proc.wait(timeout=120)
                # 130/143: interrupted as Ctrl-C interrupts it (common/cluster/stopping.py)
                how = "stopped" if code in (130, 143) else "ended"
            except subprocess.TimeoutExpired:  # no orderly stop: it resumes from an older one
                proc.kill()
                code, how = proc.wait(), "killed after 120 s"
            release(run.run_dir)
            print(f"{run.name}: {how} (exit {code}), see {run.run_dir}/train.log", file=sys.stderr)
        raise
    finally:
        bar.close()
    if failed:
        raise RunFailed("runs failed: " + "; ".join(failed))


def eval_settings(spec: CompareSpec, runs: list[PlannedRun]) -> EvalSettings:
    e = spec.eval
    return EvalSettings.for_run(
        runs[0].config,
        splits=e.splits,
        prompts_per_split=e.prompts_per_split,
        samples_per_prompt=e.samples_per_prompt,
        seed=e.seed,
    )


def _eval_dir(run: PlannedRun, view: str) -> Path:
    return run.run_dir / "eval" / view


def evaluate_runs(
    spec: CompareSpec, runs: list[PlannedRun], progress: bool = True
) -> dict[str, dict]:
    """Evaluate the base once and every run's model at each view (``budget``: the
    final weights; ``at_iterations``: the checkpoint after that iteration), paired
    against the base on the same noise. Cached in each run's eval/<view>/."""
    settings = eval_settings(spec, runs)
    if spec.eval.threads:
        import torch

        torch.set_num_threads(spec.eval.threads)
    views = ["budget"]
    if spec.budget.also_at_iterations:
        views.append("at_iterations")
    sources = {(run.name, view): _source(run, view, spec) for run in runs for view in views}
    todo = [
        (run, view)
        for run in runs
        for view in views
        if sources[run.name, view] is not None and not _cached(_eval_dir(run, view), settings)
    ]
    # a run that ended at also_at_iterations: that view is its final weights' evaluation
    copies = [
        (run, view)
        for run, view in todo
        if view != "budget"
        and sources[run.name, view].as_dict() == sources[run.name, "budget"].as_dict()
    ]
    copied = {(run.name, view) for run, view in copies}
    todo = [(run, view) for run, view in todo if (run.name, view) not in copied]
    base_dir = spec.root / "base"
    scorers = base_summary = None
    base: dict[str, SplitSamples] | None = None
    if todo or not _cached(base_dir, settings):
        scorers = make_scorers(settings.scorers, settings.device)
        base_source = resolve_policy(resolve_path(runs[0].config.model.pretrained))
        base = evaluate_policy(load_policy(base_source), settings, scorers)
        base_summary = eval_summary(base, None, settings, {"model": base_source.as_dict()})
        write_eval_outputs(base_dir, base_summary, base, None, None, "base")
        _save_tiles(base_dir, base)
    for run, view in tqdm(todo, desc="compare eval", disable=not progress):
        source = sources[run.name, view]
        model = evaluate_policy(load_policy(source), settings, scorers)
        summary = eval_summary(model, base, settings, {"model": source.as_dict()})
        summary["base_metrics"] = {k: v["metrics"] for k, v in base_summary["splits"].items()}
        out = _eval_dir(run, view)
        write_eval_outputs(out, summary, model, base, base_summary, spec.label(run.method))
        _save_tiles(out, model)
    for run, view in copies:
        shutil.copytree(_eval_dir(run, "budget"), _eval_dir(run, view), dirs_exist_ok=True)
    return {
        "base": json.loads((base_dir / "eval.json").read_text()),
        "runs": {
            f"{run.name}/{view}": json.loads((_eval_dir(run, view) / "eval.json").read_text())
            for run in runs
            for view in views
            if (_eval_dir(run, view) / "eval.json").is_file()
        },
    }


def _source(run: PlannedRun, view: str, spec: CompareSpec) -> PolicySource | None:
    if view == "budget":
        return resolve_policy(run.run_dir, checkpoint="final")
    it = spec.budget.also_at_iterations
    done = (finished(run.run_dir) or {}).get("iterations", 0)
    if done == it:
        return resolve_policy(run.run_dir, checkpoint="final")
    if done < it:
        return None  # the run stopped before that iteration (its budget ran out)
    return resolve_policy(run.run_dir, checkpoint=str(it))


def _cached(out: Path, settings: EvalSettings) -> bool:
    path = out / "eval.json"
    if not path.is_file():
        return False
    return json.loads(path.read_text()).get("settings") == settings.model_dump(mode="json")


def _save_tiles(out: Path, samples: dict[str, SplitSamples]) -> None:
    """The samples the side-by-side grids show (8 prompts × 3 samples): held-out ones,
    or the first split's where held-out is not evaluated (a learning-rate sweep)."""
    import numpy as np

    from ..run_directory.grids import spread_rows

    held = samples.get("held_out") or next(iter(samples.values()))
    rows = spread_rows(len(held.prompts), 8)
    np.savez_compressed(
        out / "tiles.npz",
        tiles=held.tiles(rows, min(3, held.per_prompt)),
        prompts=np.array([held.prompts[r] for r in rows]),
        split=np.array(held.split),
    )


def compare(
    spec: CompareSpec,
    *,
    progress: bool = True,
    train: bool = True,
    train_one: TrainOne | None = None,
) -> Path:
    """The whole comparison; returns the directory holding results.json.
    ``train_one``: how the runs are trained (:func:`train_runs`)."""
    from .compare_results import write_results

    if train_one is not None and spec.parallel > 1:
        raise UsageError(
            f"--in-process trains one run at a time; the spec asks parallel: {spec.parallel}"
            " (runs at once need their own processes: leave out --in-process)"
        )
    runs = plan_runs(spec)
    bases = {run.config.model.pretrained for run in runs}
    if len(bases) > 1:
        raise ConfigError(f"every method must start from the same model.pretrained, got {bases}")
    for run in runs:
        check_unchanged(run)
    spec.root.mkdir(parents=True, exist_ok=True)
    (spec.root / "spec.json").write_text(json.dumps(spec.record(), indent=1))
    if train:
        train_runs(spec, runs, progress, train_one=train_one)
    missing = [r.name for r in runs if finished(r.run_dir) is None]
    if missing:
        print(f"not finished yet, left out: {', '.join(missing)}", file=sys.stderr)
    done = [r for r in runs if finished(r.run_dir) is not None]
    if not done:
        raise RunDirError("no finished runs to evaluate")
    evaluations = evaluate_runs(spec, done, progress)
    write_results(spec, done, evaluations)
    return spec.root
