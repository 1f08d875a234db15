"""config_differences: where a resumed run's recorded config and a comparison's run on
disk differ from what was given (orchestration/lifecycle.py, evaluation/compare.py)."""

from g2rpo.common.config.diff import config_differences
from g2rpo.common.config.loading import load_config


def test_differences_name_each_changed_leaf_with_both_values():
    a = load_config("configs/tiny.yaml").model_dump(mode="json")
    b = load_config("configs/tiny.yaml", ["optim.lr=3e-4", "train.eval.seed=7"]).model_dump(
        mode="json"
    )
    assert config_differences(a, a) == []
    assert config_differences(a, b) == [
        ("optim.lr", a["optim"]["lr"], 3e-4),
        ("train.eval.seed", 10_000, 7),
    ]
    # a mapping against a leaf is one difference, not a walk into either
    assert config_differences({"x": {"y": 1}}, {"x": 2}) == [("x", {"y": 1}, 2)]
