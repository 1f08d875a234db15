"""Every compare spec under configs/compare/ runs as shipped: it loads, and each of its
(method, seed) runs is a valid training config (a renamed field or a method's refused
setting fails here, not an hour into `g2rpo compare`). The specs' runs are planned, not
trained."""

from pathlib import Path

import pytest
from g2rpo.common.config.loading import load_config
from g2rpo.common.errors import ConfigError
from g2rpo.evaluation.compare_spec import load_spec, plan_runs

SPECS = sorted((Path(__file__).parents[1] / "configs" / "compare").glob("*.yaml"))


RESULT_SPECS = sorted((Path(__file__).parents[1] / "docs" / "results").rglob("spec.yaml"))


@pytest.mark.parametrize("path", RESULT_SPECS, ids=lambda p: str(p.parent.name))
def test_a_committed_result_says_what_ran_on_its_own(path):
    """Each docs/results/*/spec.yaml, the spec its results came from, plans its runs where it
    lies: an `extends` into configs/compare/ would not resolve there, so the copy holds the
    overrides written out."""
    assert plan_runs(load_spec(path))


def test_there_are_specs():
    assert {p.name for p in SPECS} >= {"methods.yaml", "lr_sweep.yaml", "lr_sweep_newer.yaml"}


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_a_shipped_spec_plans_every_run(path):
    spec = load_spec(path)
    runs = plan_runs(spec)
    assert len(runs) == len(spec.methods) * len(spec.seeds)
    assert len({r.name for r in runs}) == len(runs)


def test_a_control_is_its_method_with_shuffled_advantages_and_a_bad_one_is_named():
    path = SPECS[0].parent / "methods.yaml"
    spec = load_spec(path)
    runs = {r.name: r.config for r in plan_runs(spec)}
    for method, control in (
        ("g2rpo", "control"),
        ("awm", "awm_control"),
        ("flowgrpo_fast", "flowgrpo_fast_control"),
    ):
        assert spec.methods[control].control_of == method
        run, shuffled = runs[f"{method}-s0"], runs[f"{control}-s0"]
        assert not run.algorithm.control and shuffled.algorithm.control
        # everything else is the method's: its algorithm, rate and schedule
        assert shuffled.algorithm.model_copy(update={"control": False}) == run.algorithm
        assert shuffled.optim == run.optim and shuffled.sampling == run.sampling
    # a method that is not there, and a control of a control
    for bad in ("nope", "control"):
        with pytest.raises(ConfigError, match=rf"methods\.awm_control\.control_of: '{bad}'"):
            load_spec(path, [f"methods.awm_control.control_of={bad}"])


@pytest.mark.parametrize("sweep", ["lr_sweep.yaml", "lr_sweep_newer.yaml", "lr_sweep_sparse.yaml"])
def test_a_rate_sweep_runs_the_compared_method_at_other_rates(sweep):
    """A sweep's `<method>-lr<rate>` is methods.yaml's `<method>` with only the rate
    changed, so the rate it picks is the rate of the method the comparison runs."""
    folder = SPECS[0].parent
    compared = {r.method: r.config for r in plan_runs(load_spec(folder / "methods.yaml"))}
    for run in plan_runs(load_spec(folder / sweep)):
        method, rate = run.method.rsplit("-lr", 1)
        ours, theirs = run.config, compared[method]
        assert ours.optim.lr == float(rate)
        assert ours.algorithm == theirs.algorithm and ours.sampling == theirs.sampling
        assert ours.optim.model_copy(update={"lr": theirs.optim.lr}) == theirs.optim


@pytest.mark.parametrize(
    ("config", "spec", "method"),
    [
        ("tiny_fast.yaml", "recipe.yaml", "recipe"),
        ("tiny_checker.yaml", "recipe_checker.yaml", "awm_checker"),
    ],
)
def test_a_shipped_recipe_trains_what_its_comparison_measured(config, spec, method):
    """`g2rpo train --config configs/<recipe>` trains the method whose held-out figures its
    header quotes: same model, rollout, algorithm, update, rewards and budget."""
    folder = SPECS[0].parent
    measured = next(r for r in plan_runs(load_spec(folder / spec)) if r.method == method).config
    shipped = load_config(folder.parent / config)
    for section in ("model", "sampling", "algorithm", "optim", "rewards"):
        assert getattr(shipped, section) == getattr(measured, section), section
    assert shipped.run.nfe_budget == measured.run.nfe_budget
    assert shipped.train.reward.scorers == measured.train.reward.scorers
