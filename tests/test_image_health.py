"""The image-health measures on images whose answers are known, the trained-vs-held-out
drift of a row, and train.guard's rule logic."""

import json
import math

import numpy as np
import pytest
from g2rpo.common import image_health as H
from g2rpo.common.config import load_config
from g2rpo.common.config_guard import GuardConfig, GuardRule
from g2rpo.common.errors import ConfigError
from g2rpo.common.guard import Guard
from g2rpo.common.shapes import parse_prompt, render_batch
from g2rpo.evaluation.evaluate import split_prompts
from g2rpo.orchestration.records import drift_entries, eval_row, held_out_metrics


def _flat(n=2, size=32, rgb=(120, 60, 200)):
    return np.broadcast_to(np.array(rgb, np.uint8), (n, size, size, 3)).copy()


def test_a_flat_image_has_no_texture_and_a_checkerboard_is_all_texture():
    flat = _flat()
    assert np.array_equal(H.high_freq(flat), [0.0, 0.0])
    assert np.array_equal(H.periodicity(flat), [0.0, 0.0])
    yy, xx = np.mgrid[:32, :32]
    board = np.where(((yy + xx) % 2 == 0)[None, :, :, None], 255, 0).astype(np.uint8)
    board = np.repeat(board, 3, axis=-1)
    # all of its power is at (0.5, 0.5) cycles per pixel, above the cutoff
    assert H.high_freq(board)[0] == pytest.approx(1.0)
    # the real FFT's half-plane counts as the full spectrum does: a mix of a fast wave
    # along y and a slow one along x, of equal power, is half high-frequency
    yy, xx = np.mgrid[:64, :64]
    mix = 127.5 + 60 * np.sin(2 * np.pi * 0.375 * yy) + 60 * np.sin(2 * np.pi * 0.0625 * xx)
    mix = np.repeat(np.rint(mix).astype(np.uint8)[None, :, :, None], 3, axis=-1)
    assert H.high_freq(mix)[0] == pytest.approx(0.5, abs=0.03)
    # a smooth ramp puts nearly all of its power below it
    ramp = np.repeat(np.linspace(0, 255, 32)[None, None, :, None], 32, 1).astype(np.uint8)
    assert H.high_freq(np.repeat(ramp, 3, axis=-1))[0] < 0.01


def test_dots_on_the_shapes_world_raise_texture_and_periodicity_over_its_true_images():
    truth = render_batch([parse_prompt(p) for p in split_prompts("held_out", 20)], seed=7)
    yy, xx = np.mgrid[:32, :32]
    dotted = truth.astype(np.float64)
    dotted[:, (yy % 4 == 1) & (xx % 4 == 1)] *= 0.6  # a faint dot grid of period 4
    dotted = dotted.astype(np.uint8)
    clean, hacked = H.per_image(truth), H.per_image(dotted)
    rise = hacked["high_freq"] - clean["high_freq"]
    assert (rise > 0.01).all() and rise.mean() > 0.05
    assert (hacked["periodicity"] > clean["periodicity"]).mean() >= 0.9
    assert np.array_equal(hacked["saturation"] > 0, clean["saturation"] > 0)


def test_saturation_thumbnails_and_the_distances_against_the_base():
    red, grey = _flat(rgb=(255, 0, 0)), _flat(rgb=(128, 128, 128))
    assert np.allclose(H.saturation(red), 1.0) and np.allclose(H.saturation(grey), 0.0)
    assert H.saturation(np.zeros((1, 16, 16, 3), np.uint8))[0] == 0.0  # black: no NaN
    # area means over near-equal cells: a 2x2 block image of a 32² image
    img = np.zeros((1, 32, 32, 3), np.uint8)
    img[:, :16, :16] = 200
    thumb = H.thumbnails(img, size=2)
    assert thumb[0, 0, 0, 0] == 200 and thumb[0, 1, 1, 0] == 0
    assert H.thumbnails(np.zeros((3, 50, 70, 3), np.uint8)).shape == (3, 16, 16, 3)
    black, white = H.thumbnails(_flat(rgb=(0, 0, 0))), H.thumbnails(_flat(rgb=(255,) * 3))
    assert np.allclose(H.base_distance(white, black), 1.0)
    assert np.allclose(H.background_shift(white, black), math.sqrt(3))
    assert np.allclose(H.base_distance(black, black), 0.0)
    # diversity: two prompts of two samples, the first pair identical, the second opposite
    pair = np.concatenate([black, white])
    four = np.concatenate([black[:1], black[:1], pair[1:3]])
    assert np.allclose(H.diversity(four, 2), [0, 0, 1, 1])
    assert np.isnan(H.diversity(four, 1)).all()
    data = H.encode_thumbnails(four)
    assert np.array_equal(H.decode_thumbnails(data), four)
    with pytest.raises(ValueError, match="prompts or samples changed"):
        H.against_base(four, four[:2], 2)


def _row(**changes):
    """An evaluation row: for each metric (mean, lo, hi) of its paired change."""
    row = {"iteration": 3}
    for name, (mean, lo, hi) in changes.items():
        row |= {f"eval/{name}": 0.5, f"eval/{name}/delta": mean}
        row |= {f"eval/{name}/delta_lo": lo, f"eval/{name}/delta_hi": hi}
    return row


def test_drift_diverges_only_when_the_trained_reward_rises_and_a_held_out_one_falls():
    row = _row(
        shapes_clip=(0.02, 0.01, 0.03),
        shapes_oracle=(-0.1, -0.2, -0.05),
        **{"shapes_oracle/pass": (-0.1, -0.2, 0.0), "health/high_freq": (0.1, 0.05, 0.2)},
    )
    assert held_out_metrics(row, {"shapes_clip": 1}) == ["shapes_oracle", "shapes_oracle/pass"]
    drift = drift_entries(row, {"shapes_clip": 1.0})
    assert drift["eval/drift/diverging"] == 1.0 and drift["eval/drift/shapes_oracle"] == -0.1
    # the trained reward's CI reaches 0: no divergence
    row["eval/shapes_clip/delta_lo"] = -0.001
    assert drift_entries(row, {"shapes_clip": 1.0})["eval/drift/diverging"] == 0.0
    # paid for its score to fall (weight -1): a fall is its gain
    row["eval/shapes_clip/delta_hi"] = -0.001
    assert drift_entries(row, {"shapes_clip": -1.0})["eval/drift/diverging"] == 1.0
    # trained on the checker: its pass rate is a part of a trained reward, not held out
    assert held_out_metrics(row, {"shapes_oracle": 1}) == ["shapes_clip"]
    assert drift_entries(row, {"shapes_clip": 1, "shapes_oracle": 1}) == {}  # nothing held out


def test_health_values_get_paired_changes_against_the_first_evaluation():
    first = {
        "prompts": ["a", "b"],
        "scores": {"r": [0.0, 0.0, 1.0, 1.0]},
        "health": {"high_freq": [0.1, 0.1, 0.2, 0.2]},
    }
    values = {"r": np.array([0.0, 0.0, 1.0, 1.0]), "health/high_freq": np.full(4, 0.5)}
    row = eval_row(values, first, per_prompt=2)
    assert row["eval/r/delta"] == 0.0
    assert row["eval/health/high_freq/delta"] == pytest.approx(0.35)
    assert row["eval/health/high_freq/delta_lo"] == pytest.approx(0.3)


def _guard(action="stop", patience=2, **rule):
    rule = rule or {"rises_by": 0.02}
    return Guard(GuardConfig(action=action, patience=patience, rules=[
        GuardRule(signal="health/high_freq", **rule)
    ]))  # fmt: skip


def test_the_guard_stops_after_patience_evaluations_in_a_row_and_not_before():
    guard = _guard()
    hot, cold = (0.1, 0.05, 0.2), (0.1, -0.01, 0.2)  # the second CI reaches below 0.02
    assert guard.observe({"iteration": 0, "loss": 1.0}) == {}  # no evaluation in the row
    assert guard.observe(_row(**{"health/high_freq": hot})) == {
        "guard/crossed": 1,
        "guard/streak": 1,
    }
    assert guard.observe(_row(**{"health/high_freq": cold}))["guard/streak"] == 0
    assert guard.observe(_row(**{"health/high_freq": hot}))["guard/streak"] == 1
    assert guard.tripped is None
    out = guard.observe({**_row(**{"health/high_freq": hot}), "iteration": 7})
    assert out["guard/stop"] == 1 and guard.tripped["iteration"] == 7
    assert "health/high_freq rises by 0.02" in guard.message()
    # off: nothing recorded, never tripped
    off = _guard(action="off")
    for _ in range(3):
        assert off.observe(_row(**{"health/high_freq": hot})) == {}
    assert off.tripped is None
    # a resumed run takes up its streak from its rows
    again = _guard()
    again.replay([_row(**{"health/high_freq": hot}), {"iteration": 4, "loss": 0.0}])
    assert again.observe(_row(**{"health/high_freq": hot}))["guard/stop"] == 1


def test_two_rules_crossed_at_alternate_evaluations_are_no_streak():
    guard = Guard(
        GuardConfig(
            action="stop",
            patience=2,
            rules=[
                GuardRule(signal="health/high_freq", rises_by=0.02),
                GuardRule(signal="health/diversity", falls_by=0.02),
            ],
        )
    )
    hot, cold, falling = (0.1, 0.05, 0.2), (0.0, -0.01, 0.01), (-0.1, -0.2, -0.05)
    rows = [
        _row(**{"health/high_freq": hot, "health/diversity": cold}),
        _row(**{"health/high_freq": cold, "health/diversity": falling}),
        _row(**{"health/high_freq": hot, "health/diversity": cold}),
    ]
    assert [guard.observe(r)["guard/streak"] for r in rows] == [1, 1, 1]
    assert guard.tripped is None
    assert guard.observe(rows[0])["guard/stop"] == 1  # texture twice in a row
    assert guard.tripped["rules"] == ["health/high_freq rises by 0.02"]
    # replayed with the guard off: never tripped, but the reading is the same
    off = Guard(GuardConfig(action="off", patience=2, rules=guard.cfg.rules))
    off.replay([*rows, rows[0]])
    assert off.tripped is None
    assert [r["trips"] for r in off.replayed([*rows, rows[0]])] == [False, False, False, True]


def test_guard_rules_take_exactly_one_test_and_name_the_field():
    with pytest.raises(ConfigError, match="exactly one of rises_by, falls_by, above, below"):
        load_config(None, ["train.guard.rules=[{signal: health/diversity}]"])
    with pytest.raises(ConfigError, match="got rises_by, above"):
        load_config(None, ["train.guard.rules=[{signal: s, rises_by: 1, above: 2}]"])
    falls = _guard(falls_by=0.02)
    assert falls.observe(_row(**{"health/high_freq": (-0.1, -0.2, -0.03)}))["guard/crossed"]
    below = _guard(below=0.6)
    assert below.observe(_row(**{"health/high_freq": (0, 0, 0)}))["guard/crossed"]  # mean 0.5


def test_a_run_the_guard_stopped_is_finished_until_resumed_with_the_guard_off(tmp_path):
    from g2rpo.orchestration.lifecycle import nothing_left
    from g2rpo.run_directory.files import mark_finished

    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "evals").mkdir()
    rows = [{"iteration": i, "nfe_train": 10, "nfe_train_total": 10 * (i + 1)} for i in range(4)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "evals" / "it_00004.json").write_text("{}")
    mark_finished(run, "guard", 4, 40)
    stop = load_config(None, ["run.iterations=10", "train.guard.action=stop"])
    assert nothing_left(stop, run)
    assert not nothing_left(load_config(None, ["run.iterations=10"]), run)  # guard off


def test_eval_health_against_a_base_reads_the_base_measures_once(monkeypatch):
    from g2rpo.evaluation.eval_outputs import split_summary
    from g2rpo.evaluation.evaluate import SplitSamples

    calls = []
    measure = H.per_image
    monkeypatch.setattr(H, "per_image", lambda im: calls.append(len(im)) or measure(im))
    red, blue = _flat(4, rgb=(255, 0, 0)), _flat(4, rgb=(0, 0, 255))
    values = {"r": np.zeros(4)}
    base = SplitSamples("held_out", ["a", "b"], 2, red, values)
    # two models compared with one base, as `g2rpo compare` does
    for model_images in (red.copy(), blue):
        model = SplitSamples("held_out", ["a", "b"], 2, model_images, values)
        health = split_summary(model, base)["health"]
    assert calls == [4, 4, 4]  # each model once, the base once
    # blue against red: every border cell moved by (−1, 0, +1), √2 in colour, 2/3 in mean |Δ|
    assert health["metrics"]["background_shift"]["mean"] == pytest.approx(math.sqrt(2))
    assert health["vs_base"]["base_distance"]["mean"] == pytest.approx(2 / 3)
    assert health["vs_base"]["diversity"]["mean"] == 0.0
