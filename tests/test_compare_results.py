"""A comparison's reference − method table from per-seed evaluations (no training):
the paired t-CI over seeds, and for a pair it cannot resolve, the seeds it would need."""

from pathlib import Path

from g2rpo.evaluation.compare_results import _versus_cell, _versus_reference
from g2rpo.evaluation.compare_spec import load_spec

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"


def _entry(method, seed, value):
    metrics = {"shapes_clip": {"mean": value}}
    return {"method": method, "seed": seed, "views": {"budget": {"held_out": {"metrics": metrics}}}}


def test_an_unresolved_pair_says_how_many_seeds_its_variance_would_need(tmp_path):
    (tmp_path / "spec.yaml").write_text(f"""
name: pair
base_config: {TINY}
seeds: [0, 1, 2]
reference: a
budget: {{iterations: 2}}
methods: {{a: {{}}, b: {{}}, c: {{}}}}
""")
    spec = load_spec(tmp_path / "spec.yaml")
    ref = [0.90, 0.95, 0.80]
    entries = [_entry("a", s, v) for s, v in enumerate(ref)]
    diffs = zip(ref, [1.0, 2.0, 3.0], strict=True)
    entries += [_entry("b", s, v - d) for s, (v, d) in enumerate(diffs)]
    entries += [_entry("c", s, v - 1.0) for s, v in enumerate(ref)]
    out = _versus_reference(spec, entries, ["budget"], ["held_out"], ["shapes_clip"])
    b = out["b"]["budget"]["held_out"]["shapes_clip"]
    # differences 1, 2, 3: mean 2 ± t(2)·1/√3 = 2.484, so zero is inside; 4 seeds would do
    assert abs(b["mean"] - 2.0) < 1e-12 and b["lo"] < 0 < b["hi"]
    assert b["seeds_to_resolve"] == 4
    assert _versus_cell(b) == "+2.0000 [-0.4841, +4.4841] (4 seeds)"
    # a constant difference is resolved: no bracket
    c = out["c"]["budget"]["held_out"]["shapes_clip"]
    assert _versus_cell(c) == "+1.0000 [+1.0000, +1.0000]"
    # two methods that agree on every seed: no number of seeds tells them apart
    same = {"mean": 0.0, "lo": 0.0, "hi": 0.0, "n": 3, "seeds_to_resolve": None}
    assert _versus_cell(same) == "+0.0000 [+0.0000, +0.0000] (no number of seeds)"
    far = {"mean": 1e-6, "lo": -1.0, "hi": 1.0, "n": 3, "seeds_to_resolve": None}
    assert _versus_cell(far).endswith("(over 10,000 seeds)")


def test_headline_of_a_sparse_reward_run_is_its_pass_rate_then_shapes_clip(tmp_path):
    from g2rpo.evaluation.compare_results import headline_metrics
    from g2rpo.evaluation.compare_spec import plan_runs

    (tmp_path / "spec.yaml").write_text(f"""
name: sparse
base_config: {TINY}
set:
  - "rewards=[{{name: shapes_strict}}]"
  - "train.reward.scorers=[shapes_clip, shapes_oracle, shapes_strict]"
seeds: [0]
budget: {{iterations: 2}}
methods: {{a: {{}}}}
""")
    runs = plan_runs(load_spec(tmp_path / "spec.yaml"))
    metrics = dict.fromkeys(["shapes_clip", "shapes_oracle", "shapes_oracle/pass", "shapes_strict"])
    evaluations = {"runs": {"a-s0/budget": {"splits": {"held_out": {"metrics": metrics}}}}}
    # shapes_strict is the checker's pass: not listed twice
    assert headline_metrics(runs, evaluations) == ["shapes_strict", "shapes_clip"]


def test_the_side_by_side_grid_names_the_split_its_tiles_came_from(tmp_path):
    import numpy as np
    from g2rpo.evaluation.compare_plots import side_by_side_title

    tiles = np.zeros((1, 1, 2, 2, 3), np.uint8)
    np.savez_compressed(tmp_path / "new.npz", tiles=tiles, split=np.array("train"))
    np.savez_compressed(tmp_path / "old.npz", tiles=tiles)  # saved before the split was
    new, old = np.load(tmp_path / "new.npz"), np.load(tmp_path / "old.npz")
    assert side_by_side_title(new, ["train"]).startswith("train prompts")
    assert side_by_side_title(old, ["held_out", "train"]).startswith("held-out prompts")
    # a learning-rate sweep evaluates the train split only: not "held-out"
    assert side_by_side_title(old, ["train"]).startswith("train prompts")
