"""Every compare spec under configs/compare/ runs as shipped: it loads, and each of its
(method, seed) runs is a valid training config (a renamed field or a method's refused
setting fails here, not an hour into `g2rpo compare`). The specs' runs are planned, not
trained."""

from pathlib import Path

import pytest
from g2rpo.evaluation.compare_spec import load_spec, plan_runs

SPECS = sorted((Path(__file__).parents[1] / "configs" / "compare").glob("*.yaml"))


def test_there_are_specs():
    assert {p.name for p in SPECS} >= {"methods.yaml", "lr_sweep.yaml", "lr_sweep_newer.yaml"}


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_a_shipped_spec_plans_every_run(path):
    spec = load_spec(path)
    runs = plan_runs(spec)
    assert len(runs) == len(spec.methods) * len(spec.seeds)
    assert len({r.name for r in runs}) == len(runs)
