"""What the memory-plan tests share (tests/test_plan.py, tests/test_plan_h200.py): the
committed world's small setting, an actor of a plan by name, and a trace cache of the
test module's own."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORLD = ROOT / "assets" / "shapes-world" / "pipeline"
SMALL = [
    f"model.pretrained={WORLD}",
    "sampling.num_steps=6",
    "sampling.sde_steps=[0,1]",
    "sampling.group_size=4",
    "sampling.prompts_per_worker=2",
    "train.image_size=64",
    "train.max_sequence_length=16",
    "rewards=[{name: shapes_clip}]",
]


def module_plan_cache(tmp_path_factory):
    """A test module's ``_plan_cache`` fixture: G2RPO_PLAN_CACHE set to a folder of its
    own while the module runs, then as it was."""
    before = os.environ.get("G2RPO_PLAN_CACHE")
    os.environ["G2RPO_PLAN_CACHE"] = str(tmp_path_factory.mktemp("plan-cache"))
    yield
    if before is None:
        del os.environ["G2RPO_PLAN_CACHE"]
    else:
        os.environ["G2RPO_PLAN_CACHE"] = before


def _actor(p, name):
    return next(a for a in p.actors if a.actor == name)
