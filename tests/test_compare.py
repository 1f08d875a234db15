"""``g2rpo compare`` end to end on the committed world: a 2-run, 2-iteration comparison
trained in this process on the session's warm actors (``--in-process``; local Ray, a
real reward server), evaluated on fixed noise; resumed without retraining; refused
when the spec changes a run; a failing run reported from a real ``g2rpo train``
process and from this one; and its HTML report (and a run's) rendered in headless
Chromium."""

import json

import pytest
from g2rpo.common.algorithms.rollout_plan import algorithm_nfe
from g2rpo.common.config.loading import dump_config, load_config
from g2rpo.common.errors import ConfigError
from g2rpo.evaluation.compare import SpecChanged, compare, evaluate_runs
from g2rpo.evaluation.compare_spec import load_spec, plan_runs
from g2rpo.evaluation.report import write_report
from g2rpo.orchestration.warm_trainer import WarmTrainer
from g2rpo.rollout_worker.plan import g2rpo_plan
from small_run import PROMPTS_PER_WORKER, SMALL_RUN

# a training run, a Ray cluster or a service: `pytest -m 'not slow'` leaves it out
pytestmark = pytest.mark.slow


def _spec_file(tmp_path, world, **changes):
    base = load_config(
        None,
        [
            *SMALL_RUN,
            f"model.pretrained={world / 'pipeline'}",
            f"train.reward.scorers=[shapes_clip={world / 'shapes_clip'}, shapes_oracle]",
            "train.eval.samples=4",
            "train.eval.per_prompt=2",
            "train.checkpoints.every=5",
            "train.eval.on_actor=false",  # one actor fewer to start per run
        ],
    )
    (tmp_path / "base.yaml").write_text(dump_config(base))
    dance_lr = changes.get("dance_lr", "1.0e-4")
    spec = f"""
name: two
output_dir: {tmp_path / "out"}
base_config: {tmp_path / "base.yaml"}
seeds: [0]
methods:
  g2rpo: {{label: G2RPO}}
  dancegrpo:
    set: [algorithm.name=dancegrpo, sampling.eta=0.3, optim.step_mode=per_samples,
          optim.lr={dance_lr}]
budget: {{iterations: 2, also_at_iterations: 1, curve_at_nfe: [100]}}
eval: {{splits: [held_out], prompts_per_split: 4, samples_per_prompt: 2}}
"""
    path = tmp_path / "spec.yaml"
    path.write_text(spec)
    return path


@pytest.fixture(scope="module")
def compared(ray_local, warm, world, tmp_path_factory):
    """The spec compared once, its runs trained in this process on the session's warm
    actors (``g2rpo compare --in-process``)."""
    tmp = tmp_path_factory.mktemp("compare")
    spec = load_spec(_spec_file(tmp, world))
    root = compare(spec, progress=False, train_one=WarmTrainer(warm))
    return tmp, spec, root


def test_compare_trains_evaluates_and_writes_its_files(compared):
    root = compared[2]
    results = json.loads((root / "results.json").read_text())
    assert list(results["methods"]) == ["g2rpo", "dancegrpo"]
    assert results["views"] == ["budget", "at_iterations"]
    assert results["headline_metrics"] == ["shapes_clip", "shapes_oracle/pass"]
    for run in results["runs"]:
        assert run["finished"]["reason"] == "iterations" and run["iterations"] == 2
        assert run["nfe_train_total"] > 0
        for view in ("budget", "at_iterations"):
            held = run["views"][view]["held_out"]
            assert set(held["vs_base"]) >= {"shapes_clip", "shapes_oracle/pass"}
    # training NFEs: per worker and iteration, G²RPO's rollout tree plus one learner
    # forward per (prompt, SDE step); DanceGRPO spends fewer
    per_worker = (
        algorithm_nfe(g2rpo_plan(PROMPTS_PER_WORKER, 6, 4, [0, 1], [1, 2])) + PROMPTS_PER_WORKER * 2
    )
    g2, dance = (results["methods"][m]["nfe_train_total"]["mean"] for m in ("g2rpo", "dancegrpo"))
    assert g2 == 2 * 2 * per_worker and dance < g2  # 2 workers · 2 iterations
    # the equal-iterations view evaluated the checkpoint after iteration 1
    ev = json.loads(
        (root / "runs" / "g2rpo-s0" / "eval" / "at_iterations" / "eval.json").read_text()
    )
    assert ev["model"]["weights"].endswith("it_00001.pt")
    table = (root / "table.md").read_text()
    assert "### at the budget" in table and "### at equal iterations" in table
    assert "| G2RPO | 1 | 2 |" in table
    log = (root / "runs" / "g2rpo-s0" / "train.log").read_text()
    assert "2 iterations in metrics.jsonl" in log, log[-2000:]
    for name in ("reward_vs_nfe.png", "reward_vs_wall.png", "grid.png", "base/eval.json"):
        assert (root / name).stat().st_size > 1_000, name
    # the grid's tiles say which split they are (its title names it)
    import numpy as np

    assert str(np.load(root / "base" / "tiles.npz")["split"]) == "held_out"
    # the runs' training-time evaluations end with the final weights' own
    evals = sorted((root / "runs" / "g2rpo-s0" / "evals").glob("*.json"))
    assert evals[-1].name == "it_00002.json"
    # budget.curve_at_nfe: the training-time evaluations read at 100 NFEs, linear between
    # iteration 0's and the next one's
    first, second = (json.loads(p.read_text()) for p in evals[:2])
    y0, y1 = (np.mean(e["scores"]["shapes_clip"]) for e in (first, second))
    expected = (y1 - y0) * 100 / second["nfe_train_total"]
    curve = results["curve_at_nfe"]["methods"]["g2rpo"]["shapes_clip"]["100"]
    assert curve["n"] == 1 and curve["mean"] == pytest.approx(expected, abs=1e-12)
    assert "training-time held-out evaluations at fixed NFEs" in table
    # image health beside the rewards, and where train.guard's rules (off here) would stop
    health = results["methods"]["g2rpo"]["health"]["budget"]["held_out"]
    assert set(health) >= {"high_freq", "background_shift", "diversity"}
    assert health["high_freq"]["runs"] == 1
    assert "### image health, held_out" in table and "| train.guard |" in table
    assert all(run["guard"]["action"] == "off" for run in results["runs"])


def test_compare_again_resumes_refuses_a_changed_spec_and_takes_a_copied_run(compared, world):
    import shutil

    tmp, spec, root = compared
    log = root / "runs" / "dancegrpo-s0" / "train.log"
    size = log.stat().st_size
    compare(spec, progress=False)
    assert log.stat().st_size == size  # finished runs are skipped
    changed = load_spec(_spec_file(tmp, world, dance_lr="3.0e-4"))
    with pytest.raises(SpecChanged, match=r"dancegrpo-s0.*optim\.lr"):
        compare(changed, progress=False)
    # a finished run copied into another comparison with the same settings is taken as
    # it is: its name and folder differ, not how it trained
    other = spec.model_copy(update={"name": "copied"})
    for run in plan_runs(other):
        shutil.copytree(root / "runs" / run.name, run.run_dir)
    compare(other, progress=False)
    copied_log = other.root / "runs" / "dancegrpo-s0" / "train.log"
    assert copied_log.stat().st_size == size  # not trained again
    assert json.loads((other.root / "results.json").read_text())["methods"]["dancegrpo"]


def test_eval_threads_and_a_run_ending_at_the_equal_iterations_view(compared, tmp_path):
    """eval.threads sets torch's CPU threads for the evaluation; when the runs end at
    also_at_iterations, that view is the final weights' evaluation, copied, not redone."""
    import shutil

    import torch

    _, spec, root = compared
    copy_root = tmp_path / "copy"
    shutil.copytree(root, copy_root / spec.name)
    for run_dir in (copy_root / spec.name / "runs").iterdir():
        shutil.rmtree(run_dir / "eval" / "at_iterations")
    ends_at_2 = spec.model_copy(
        update={
            "output_dir": copy_root,
            "eval": spec.eval.model_copy(update={"threads": 1}),
            "budget": spec.budget.model_copy(update={"also_at_iterations": 2}),
        }
    )
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        evaluations = evaluate_runs(ends_at_2, plan_runs(ends_at_2), progress=False)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    for run in plan_runs(ends_at_2):
        final = (run.run_dir / "eval" / "budget" / "eval.json").stat()
        view = (run.run_dir / "eval" / "at_iterations" / "eval.json").stat()
        assert view.st_mtime == pytest.approx(final.st_mtime, abs=1e-3)  # a copy
        at, budget = (evaluations["runs"][f"{run.name}/{v}"] for v in ("at_iterations", "budget"))
        assert at == budget and at["model"]["kind"] == "run-final"


def test_a_failing_run_is_named_with_its_log_from_a_process_and_in_process(
    ray_local, world, tmp_path, monkeypatch
):
    """The run's `g2rpo train` process exits 2 (its prompts file is missing); compare
    names the run, the exit code and its log. `g2rpo compare --in-process` names the
    same failure from its own process (same line in the log), and refuses parallel."""
    import re
    import subprocess

    from g2rpo.common.errors import RunFailed, UsageError
    from servers import G2RPO, session_ray_env

    monkeypatch.setenv("RAY_ADDRESS", session_ray_env()["RAY_ADDRESS"])
    path = _spec_file(tmp_path, world)
    # one method: the spec without its dancegrpo entry
    path.write_text(re.sub(r"  dancegrpo:\n(    .*\n)+", "", path.read_text()))
    missing = tmp_path / "missing.txt"
    over = [f"methods.g2rpo.set=[train.prompts={missing}]"]
    spec = load_spec(path, over)
    assert list(spec.methods) == ["g2rpo"]
    run_dir = spec.root / "runs" / "g2rpo-s0"
    with pytest.raises(RunFailed, match=r"g2rpo-s0 \(exit 2, see .*train\.log\)"):
        compare(spec, progress=False)
    assert "train.prompts" in (run_dir / "train.log").read_text()

    cmd = [G2RPO, "compare", str(path), "--in-process", "--no-progress", "--set", over[0]]
    here = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert here.returncode == 2, here.stdout + here.stderr
    assert re.search(r"runs failed: g2rpo-s0 \(train\.prompts: .*train\.log\)", here.stderr)
    assert (run_dir / "train.log").read_text().count("train.prompts") == 2
    with pytest.raises(UsageError, match="parallel: 2"):
        compare(spec.model_copy(update={"parallel": 2}), train_one=lambda *_: None)


def test_spec_errors_name_the_field(tmp_path, world):
    path = _spec_file(tmp_path, world)
    with pytest.raises(ConfigError, match="exactly one of nfe and iterations"):
        load_spec(path, ["budget.nfe=100"])
    with pytest.raises(ConfigError, match=r"methods\.dancegrpo"):
        plan_runs(load_spec(path, ["methods.dancegrpo.set=[optim.lr=-1]"]))
    with pytest.raises(ConfigError, match="reference"):
        load_spec(path, ["reference=nope"])


def test_reports_render_in_headless_chromium(compared, tmp_path):
    from g2rpo.evaluation.browser import check_page

    _, _, root = compared
    page = write_report(root)
    shot = tmp_path / "compare.png"
    check = check_page(
        page,
        [
            "#results-budget tr",
            "#results-at_iterations tr",
            "#curves img",
            "#samples img",
            "#vs-reference tr",
            "#runs tr",
        ],
        shot,
    )
    assert check.console_errors == [] and check.broken_images == 0
    assert check.title == "g2rpo — comparison two"
    assert check.found["#results-budget tr"] == 4  # header, two methods, base
    assert check.found["#curves img"] == 2 and check.found["#samples img"] == 1
    assert check.found["#runs tr"] == 3
    assert shot.stat().st_size > 50_000
    run_page = write_report(root / "runs" / "g2rpo-s0")
    check = check_page(
        run_page,
        ["#summary", "#headline tr", "#curves img", "#samples img", ".final-eval", "#watch tr"],
        tmp_path / "run.png",
    )
    assert check.console_errors == [] and check.broken_images == 0
    assert check.found["#curves img"] == 6  # rewards, eval, advantages, ratio, loss, time
    assert check.found["#samples img"] >= 2 and check.found[".final-eval"] == 2
    assert check.found["#headline tr"] >= 3
    assert check.found["#watch tr"] == 3  # the header and the run's two evaluations
    print(f"screenshots: {shot} and {tmp_path / 'run.png'}")
