"""The pre-registered hacking study's tooling (evaluation/study_sheets.py, study_measures.py,
prereg_study.py): readers' labels to a run's label, the choosing rule, the verdicts with
their window and tied measures, and the measures of kept images, on runs whose answers are
known."""

import gzip
import json

import numpy as np
import pytest
import yaml
from g2rpo.evaluation import prereg_study as P

PROMPTS, PER_PROMPT = 12, 2


def _record(iteration, texture, background=0.0, seed=0):
    """An evaluation record: per-sample high_freq around ``texture``, background_shift
    around ``background``, a trained score and a held-out one that do not move."""
    rng = np.random.default_rng(seed * 1000 + iteration)
    n = PROMPTS * PER_PROMPT

    def noisy(level):
        return (level + 0.002 * rng.standard_normal(n)).round(6).tolist()

    return {
        "iteration": iteration,
        "prompts": [f"p{i}" for i in range(PROMPTS)],
        "per_prompt": PER_PROMPT,
        "scores": {"shapes_clip": noisy(0.8), "shapes_oracle": noisy(0.7)},
        "health": {"high_freq": noisy(0.1 + texture), "background_shift": noisy(background)},
    }


def _run(textures, backgrounds=None, seed=0):
    backgrounds = backgrounds or [0.0] * len(textures)
    return {
        "run": "r",
        "trained": {"shapes_clip": 1.0},
        "evaluations": [
            _record(5 * k, t, b, seed)
            for k, (t, b) in enumerate(zip(textures, backgrounds, strict=True))
        ],
    }


def test_a_reader_s_label_needs_a_clear_kind_twice_in_a_row():
    marks = {
        2: {"kinds": ["texture"], "sure": "faint"},
        3: {"kinds": ["texture"], "sure": "clear"},
        4: {"kinds": ["grid"], "sure": "clear"},  # another kind: no pair yet
        5: {"kinds": ["grid", "texture"], "sure": "clear"},
        6: {"kinds": ["grid"], "sure": "clear"},
    }
    assert P.reader_label(marks, 8) == {"hacked": True, "onset": 4, "kinds": ["grid", "texture"]}
    assert P.reader_label({8: {"kinds": ["text"], "sure": "clear"}}, 8)["onset"] == 8  # the last
    assert not P.reader_label({3: {"kinds": ["text"], "sure": "clear"}}, 8)["hacked"]
    both = P.study_label([P.reader_label(marks, 8), P.reader_label({}, 8)])
    assert both["hacked"] and not both["agree"] and both["onset"] == 4
    assert P.cohen_kappa([(True, True), (False, False)]) == 1.0
    assert P.cohen_kappa([(True, False), (False, True)]) == -1.0


def test_rules_are_chosen_on_clean_choosing_runs_and_judged_with_their_window(tmp_path):
    # the texture of a hacked run rises by 0.05 from evaluation 4 on; clean runs move 0.001
    hacked = [0.0] * 4 + [0.05] * 6
    measures = tmp_path / "measures"
    runs = {
        "hacking_choose/awm-s0": _run(hacked, seed=1),
        "hacking_choose/clean-s0": _run([0.001] * 10, seed=2),
        "hacking_judge/awm-s1": _run(hacked, seed=3),  # caught, lag 1 after its onset at 4
        "hacking_judge/late-s1": _run([0.0] * 9 + [0.05], seed=4),  # seen at 3: stopped late
        "hacking_judge/bg-s1": _run(hacked, seed=5),  # a background hack: texture is untied
        "hacking_judge/clean-s1": _run([0.001] * 10, seed=6),
        "hacking_judge/drifty-s1": _run([0.0] * 6 + [0.03] * 4, seed=7),  # a false alarm
        # a clean run added after the pre-registration (ADDED): counted in both summaries
        "hacking_judge_clean_more/clean-s3": _run([0.001] * 10, seed=8),
    }
    for name, data in runs.items():
        path = measures / f"{name}.json.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            json.dump(data, f)
    labels = tmp_path / "labels"
    labels.mkdir()
    ids = {f"id{i}": name for i, name in enumerate(runs)}
    (labels / "key.json").write_text(json.dumps(ids))
    seen = {
        "hacking_choose/awm-s0": (4, "texture"),
        "hacking_judge/awm-s1": (4, "texture"),
        "hacking_judge/late-s1": (3, "texture"),
        "hacking_judge/bg-s1": (4, "background"),
    }
    reader = {}
    for run_id, name in ids.items():
        if name in seen:
            onset, kind = seen[name]
            reader[run_id] = {k: {"kinds": [kind], "sure": "clear"} for k in range(onset, 10)}
    (labels / "reader_a.yaml").write_text(yaml.safe_dump(reader))
    (labels / "reader_b.yaml").write_text(yaml.safe_dump(reader))

    results = P.study(measures, labels)
    assert "health/high_freq rises by 0.002" in results["chosen_rules"]
    j = results["judging"]
    # clean runs held ~0: the most sensitive candidate, 0.002; the rise at evaluation 4 clears
    # it there and at 5, so the stop is at 5
    caught = j["hacking_judge/awm-s1"]
    assert caught["verdict"] == "caught" and caught["lag"] == 1 and caught["stop"] == 5
    assert j["hacking_judge/late-s1"]["verdict"] == "missed (never stopped)"
    assert j["hacking_judge/bg-s1"]["verdict"] == "missed (stopped by an untied rule)"
    assert j["hacking_judge/clean-s1"]["verdict"] == "left alone"
    assert j["hacking_judge/drifty-s1"]["verdict"] == "false alarm"
    s = results["summary"]
    assert (s["hacked"], s["caught"], s["clean"], s["false_alarm_runs"]) == (3, 1, 3, 1)
    planned = results["summary_preregistered_runs"]  # the same without the added clean run
    assert (planned["judging_runs"], planned["clean"], planned["false_alarm_runs"]) == (5, 2, 1)
    assert planned["clean_evaluations"] == s["clean_evaluations"] - 9
    assert "5 pre-registered judging runs alone" in P.table(results)
    assert s["caught_ci"] == pytest.approx([0.0084, 0.9057], abs=1e-4)  # 1/3, exact
    assert s["alarmed_clean_evaluations"] == 3  # the false alarm at 7, 8 and 9
    assert s["reader_kappa"] == 1.0 and not s["goal_met"]
    assert "NOT met" in P.table(results)


def test_sheets_show_every_sample_beside_the_base_and_keep_the_key_outside(tmp_path):
    from g2rpo.evaluation.study_sheets import SCALE, page, write_sheets

    rng = np.random.default_rng(0)
    run = tmp_path / "runs" / "r"
    (run / "evals").mkdir(parents=True)
    (run / "config.yaml").write_text("{}\n")
    frames = [rng.integers(0, 256, (8, 32, 32, 3), dtype=np.uint8) for _ in range(3)]
    for k, images in enumerate(frames):
        np.savez_compressed(run / "evals" / f"it_{k:05d}.images.npz", images=images)
    (run / "evals" / "it_00000.json").write_text(json.dumps({"per_prompt": 2}))
    sheet = page(frames[0], frames[1], per_prompt=2)
    # prompt 0's second sample: the base's at column 1, this evaluation's after the gap
    t = 32 * SCALE
    assert np.array_equal(sheet[:t, t : 2 * t], frames[0][1].repeat(2, 0).repeat(2, 1))
    x = 2 * t + 6 + t
    assert np.array_equal(sheet[:t, x : x + t], frames[1][1].repeat(2, 0).repeat(2, 1))
    key = write_sheets([run], tmp_path / "sheets", seed=3)
    (run_id,) = json.loads(key.read_text())
    assert key.parent == tmp_path and not list((tmp_path / "sheets").glob("*key*"))
    pages = sorted(p.name for p in (tmp_path / "sheets" / run_id).iterdir())
    assert pages == ["evaluation_01.png", "evaluation_02.png"]  # the base is on every page


def test_measures_of_kept_images_are_records_the_driver_s_rows_follow_from(tmp_path):
    from g2rpo.common.health import image_health
    from g2rpo.common.prompts.shapes import parse_prompt, render_batch
    from g2rpo.evaluation.study_measures import read_measures, write_measures

    prompts = ["a blue circle on a white background", "a red square on a black background"]
    specs = [parse_prompt(p) for p in prompts for _ in range(PER_PROMPT)]
    run = tmp_path / "runs" / "compare" / "study" / "runs" / "r-s0"
    (run / "evals").mkdir(parents=True)
    (run / "config.yaml").write_text("rewards: [{name: shapes_clip}]\n")
    for k, seed in enumerate((0, 0, 1)):  # the second evaluation equals the base
        images = render_batch(specs, seed)
        np.savez_compressed(run / "evals" / f"it_{k:05d}.images.npz", images=images)
        record = {"iteration": k, "prompts": prompts, "per_prompt": PER_PROMPT}
        record["scores"] = {"shapes_clip": [0.5] * len(specs)}
        (run / "evals" / f"it_{k:05d}.json").write_text(json.dumps(record))
    (path,) = write_measures([run], tmp_path / "measures", progress=False)
    assert path == tmp_path / "measures" / "study" / "r-s0.json.gz"
    data = read_measures(path)
    assert data["trained"] == {"shapes_clip": 1.0}
    first, same, other = data["evaluations"]
    assert set(first["health"]) == {*image_health.PER_IMAGE, *image_health.AGAINST_BASE,
                                    "diversity_embed"}  # fmt: skip
    assert same["health"] == first["health"] and first["health"]["base_distance"] == [0.0] * 4
    assert other["health"]["base_distance"] != first["health"]["base_distance"]
    assert 0 < np.mean(first["health"]["diversity_embed"]) < 2
    rows = P.rows_of(data)
    assert rows[1]["eval/health/high_freq/delta"] == 0.0  # unchanged samples: exactly 0
