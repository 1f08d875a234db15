"""Run-directory bookkeeping: checkpoint retention, resume truncation, the eval schedule."""

from pathlib import Path

from g2rpo.common.config.loading import load_config
from g2rpo.orchestration.budget import Budget
from g2rpo.orchestration.driver import TrainingLoop
from g2rpo.run_directory.files import (
    append_metrics,
    finished,
    latest_checkpoint,
    list_checkpoints,
    mark_finished,
    prune_checkpoints,
    read_metrics,
    save_evaluation,
    truncate_metrics,
)


def _touch(run: Path, *its: int) -> None:
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    for i in its:
        (run / "checkpoints" / f"it_{i:05d}.pt").write_bytes(b"x")


def test_keep_checkpoints_keeps_the_newest_and_the_pinned(tmp_path):
    cfg = load_config(None, ["train.checkpoints.keep=2", "train.checkpoints.at=[10]"])
    _touch(tmp_path, 5, 10, 15, 20, 25)
    gone = prune_checkpoints(tmp_path, cfg)
    left = sorted(p.stem for p in (tmp_path / "checkpoints").glob("*.pt"))
    assert left == ["it_00010", "it_00020", "it_00025"]
    assert sorted(p.stem for p in gone) == ["it_00005", "it_00015"]
    assert prune_checkpoints(tmp_path, load_config(None)) == []  # default: keep all


def _sharded(run: Path, i: int, complete: bool = True, partial: bool = False) -> Path:
    name = f"it_{i:05d}.dcp" + (".partial" if partial else "")
    d = run / "checkpoints" / name
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(b"x")
    if complete:
        (d / "g2rpo.json").write_text('{"version": 1, "iteration": 1}')
    return d


def test_checkpoints_of_both_layouts_are_listed_by_iteration_and_leftovers_pruned(tmp_path):
    _touch(tmp_path, 5, 20)
    _sharded(tmp_path, 10)
    _sharded(tmp_path, 15)
    _sharded(tmp_path, 25, complete=False)  # a crash before the marker
    _sharded(tmp_path, 30, partial=True)  # a crash mid-save
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "it_00005.pt",
        "it_00010.dcp",
        "it_00015.dcp",
        "it_00020.pt",
    ]
    assert latest_checkpoint(tmp_path).name == "it_00020.pt"  # never a half-written one
    cfg = load_config(None, ["train.checkpoints.keep=2", "train.checkpoints.at=[10]"])
    gone = sorted(p.name for p in prune_checkpoints(tmp_path, cfg))
    assert gone == ["it_00005.pt", "it_00025.dcp", "it_00030.dcp.partial"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "it_00010.dcp",
        "it_00015.dcp",
        "it_00020.pt",
    ]


def test_resume_truncates_metrics_evals_and_the_finished_mark(tmp_path):
    for i in range(4):
        append_metrics(tmp_path, {"iteration": i})
        save_evaluation(tmp_path, i, {"iteration": i})
    mark_finished(tmp_path, "iterations", 4, 123)
    assert finished(tmp_path)["nfe_train_total"] == 123
    kept = truncate_metrics(tmp_path, 2)
    assert (
        [r["iteration"] for r in kept] == [0, 1] == [r["iteration"] for r in read_metrics(tmp_path)]
    )
    assert sorted(p.name for p in (tmp_path / "evals").iterdir()) == [
        "it_00000.json",
        "it_00001.json",
    ]
    assert finished(tmp_path) is None


def _loop(overrides):
    cfg = load_config(None, overrides)
    return TrainingLoop(cfg, Path("."), None, [], [])


def test_eval_every_iterations_or_every_n_training_nfes():
    loop = _loop(["train.eval.every=3"])
    assert [it for it in range(8) if loop.eval_due(it)] == [0, 3, 6]
    loop = _loop(["train.eval.every_nfe=1000"])
    due = []
    for it in range(8):  # 400 training NFEs per iteration
        if loop.eval_due(it):
            due.append(it)
            loop.last_eval_nfe = loop.budget.total
        loop.budget.add(400)
    assert due == [0, 3, 6]  # at 0, 1200, 2400 NFEs
    assert isinstance(loop.budget, Budget)


class _CountingLoop(TrainingLoop):
    """The loop's own run(): its stop rule and progress bar, with each iteration's work
    (Ray actors) replaced by a row that spends 400 training NFEs."""

    def iteration(self, it, last, evaluate=False):
        self.budget.add(400)
        if evaluate:
            self.forced.append(it)
        return {
            "iteration": it,
            "reward/shapes_clip": 0.5,
            "loss": 0.0,
            "time/iteration_s": 0.1,
            "nfe_train": 400,
            "nfe_train_total": self.budget.total,
        }

    def record(self, row, stop):
        self.rows.append(row)

    def checkpoint(self, done, last=False):
        pass


def _counting(overrides):
    loop = _CountingLoop(load_config(None, overrides), Path("."), None, [], [])
    loop.rows, loop.forced = [], []
    return loop


def test_the_progress_bar_counts_what_stops_the_run(capsys):
    # an NFE budget stops the run: the bar counts training NFEs up to the budget, not
    # iterations up to run.iterations (100000 here), so its total and ETA are the run's
    loop = _counting(["run.nfe_budget=1000", "run.iterations=100000"])
    assert loop.run(0, 100000, progress=True) == 2  # a third iteration would pass 1000
    bar = capsys.readouterr().err.split("\r")[-1]
    assert "800/1.00k" in bar and "NFE" in bar and "iteration=2" in bar and "100000" not in bar
    loop = _counting(["run.nfe_budget=null", "run.iterations=3"])
    assert loop.run(0, 3, progress=True) == 3
    assert "3/3" in capsys.readouterr().err.split("\r")[-1]


def test_only_a_session_stopped_short_of_the_run_evaluates_its_last_iteration():
    # a finished run's trained weights are evaluated after the loop (lifecycle.finish):
    # its last iteration, one update short of them, is evaluated only when due
    loop = _counting(["run.iterations=5", "train.eval.every=25"])
    assert loop.run(0, 3, progress=False) == 3  # --max-iterations 3: not finished
    assert loop.forced == [2]
    assert loop.run(3, 5, progress=False) == 5  # the rest: finish() evaluates
    assert loop.forced == [2]
    loop = _counting(["run.nfe_budget=1000", "run.iterations=100000"])
    assert loop.run(0, 100000, progress=False) == 2 and loop.forced == []


def test_a_resume_missing_its_recorded_checkpoint_changes_nothing_and_says_why(tmp_path):
    """The record says iteration 4's checkpoint was written (checkpoints.jsonl); the
    directory holds only iteration 2's (the newer one was written on a node the driver
    does not see, or deleted). A resume must not start from it_00002 and drop rows 2
    and 3, nor from 0 and drop everything: it stops before any actor starts, with
    metrics.jsonl and evals/ as they were."""
    import pytest
    from g2rpo.common.config.loading import dump_config
    from g2rpo.common.errors import RunDirError
    from g2rpo.orchestration.driver import train
    from g2rpo.run_directory.files import checkpoint_to_resume, record_checkpoint

    run = tmp_path / "run"
    _touch(run, 2)
    (run / "config.yaml").write_text(dump_config(load_config(None, ["run.iterations=6"])))
    for i in range(4):
        append_metrics(run, {"iteration": i, "nfe_train_total": 10 * (i + 1), "nfe_train": 10})
        save_evaluation(run, i, {"iteration": i, "nfe_train_total": 10 * (i + 1)})
    record_checkpoint(run, run / "checkpoints" / "it_00002.pt")
    record_checkpoint(run, run / "checkpoints" / "it_00004.pt")  # not there
    before = {p.name: p.read_bytes() for p in [run / "metrics.jsonl", *run.glob("evals/*")]}
    with pytest.raises(RunDirError, match=r"iteration 4 \(checkpoints/it_00004.pt\).*not there"):
        train(None, [], resume=run, progress=False)
    after = {p.name: p.read_bytes() for p in [run / "metrics.jsonl", *run.glob("evals/*")]}
    assert after == before
    # once it is back (or a newer one), that is what a resume loads
    _touch(run, 4)
    assert checkpoint_to_resume(run).name == "it_00004.pt"
    # a run without a record (written before it existed) resumes from what it finds
    (run / "checkpoints.jsonl").unlink()
    (run / "checkpoints" / "it_00004.pt").unlink()
    assert checkpoint_to_resume(run).name == "it_00002.pt"


def test_a_sample_grid_of_720px_samples_stays_small_and_takes_only_the_grid_images(tmp_path):
    """An evaluation of 400 samples of 720² sends back only the grid's images (8 prompts,
    their first 4 samples at most), and the grid draws them at most 256 px a side: at the
    old 3x a FLUX grid was 17,000 pixels wide."""
    import numpy as np
    from g2rpo.run_directory.files import grid_samples, write_sample_grid
    from PIL import Image

    prompts = [f"prompt {i}" for i in range(100) for _ in range(4)]  # 100 prompts x 4
    shown = grid_samples(len(prompts), per_prompt=4)
    assert len(shown) == 8 * 4 and shown == sorted(shown) and shown[:4] == [0, 1, 2, 3]
    images = np.random.default_rng(0).integers(0, 255, (len(shown), 720, 720, 3), dtype=np.uint8)
    write_sample_grid(tmp_path / "g.png", images, prompts, 4, title="t")
    width, height = Image.open(tmp_path / "g.png").size
    assert width < 1600 and height < 2400
    assert grid_samples(3, per_prompt=1) == [0, 1, 2]
