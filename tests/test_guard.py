"""train.guard's rule logic on metrics rows (common/health/guard.py), its alarm and the healthy
checkpoint it keeps (run_directory/healthy.py), rules relative to the base, the rules by
image size (common/config/guard_defaults.py) and rules fitted to clean runs
(evaluation/guard_calibration.py, `g2rpo guard calibrate`)."""

import json
from pathlib import Path

import pytest
from g2rpo.common.config.guard import GuardConfig, GuardRule
from g2rpo.common.config.loading import load_config
from g2rpo.common.errors import ConfigError
from g2rpo.common.health.guard import Guard


def _row(iteration=3, **changes):
    """An evaluation row: for each metric (mean, lo, hi) of its paired change; the base's
    mean is 0.5 − the change's mean (the row holds the evaluation's mean, 0.5)."""
    row = {"iteration": iteration}
    for name, (mean, lo, hi) in changes.items():
        row |= {f"eval/{name}": 0.5, f"eval/{name}/delta": mean}
        row |= {f"eval/{name}/delta_lo": lo, f"eval/{name}/delta_hi": hi}
    return row


def _guard(action="stop", patience=2, say=None, **rule):
    rule = rule or {"rises_by": 0.02}
    return Guard(GuardConfig(action=action, patience=patience, rules=[
        GuardRule(signal="health/high_freq", **rule)
    ]), say=say)  # fmt: skip


HOT, COLD = (0.1, 0.05, 0.2), (0.1, -0.01, 0.2)  # the second CI reaches below 0.02
RULE = "health/high_freq rises by 0.02"


def test_the_guard_stops_after_patience_evaluations_in_a_row_and_not_before():
    guard = _guard()
    assert guard.observe({"iteration": 0, "loss": 1.0}) == {}  # no evaluation in the row
    assert guard.observe(_row(**{"health/high_freq": HOT})) == {
        "guard/crossed": 1,
        "guard/streak": 1,
        "guard/missing": 0,
        f"guard/rule/{RULE}": 1,
    }
    assert guard.observe(_row(**{"health/high_freq": COLD}))["guard/streak"] == 0
    assert guard.observe(_row(**{"health/high_freq": HOT}))["guard/streak"] == 1
    assert guard.tripped is None
    out = guard.observe(_row(7, **{"health/high_freq": HOT}))
    assert out["guard/stop"] == 1 and out["guard/tripped"] == 1
    assert guard.tripped["iteration"] == 7 and guard.stops
    assert RULE in guard.message()
    # off: nothing recorded, never tripped
    off = _guard(action="off")
    for _ in range(3):
        assert off.observe(_row(**{"health/high_freq": HOT})) == {}
    assert off.tripped is None
    # a resumed run takes up its streak from its rows
    again = _guard()
    again.replay([_row(**{"health/high_freq": HOT}), {"iteration": 4, "loss": 0.0}])
    assert again.observe(_row(**{"health/high_freq": HOT}))["guard/stop"] == 1


def test_alert_raises_the_alarm_once_names_the_last_healthy_evaluation_and_trains_on():
    # caught: train.guard knew only off and stop; a run could not be told of a hack and
    # go on, nor be rolled back to its last healthy weights
    said = []
    guard = _guard(action="alert", say=said.append)
    rows = [
        _row(0, **{"health/high_freq": (0, 0, 0)}),
        _row(5, **{"health/high_freq": COLD}),
        _row(10, **{"health/high_freq": HOT}),
        _row(15, **{"health/high_freq": HOT}),
        _row(20, **{"health/high_freq": HOT}),
    ]
    outs = [guard.observe(r) for r in rows]
    assert [o.get("guard/alert") for o in outs] == [None, None, None, 1, None]
    assert [o.get("guard/tripped") for o in outs] == [None, None, None, 1, 1]
    assert not any("guard/stop" in o for o in outs) and not guard.stops
    assert guard.tripped == {"iteration": 15, "rules": [RULE], "last_healthy": 5}
    assert len(said) == 1 and "raised its alarm after iteration 15" in said[0]
    assert "last healthy evaluation was iteration 5" in said[0]
    # a resumed alert run knows it already raised it, and where health was last
    again = _guard(action="alert")
    again.replay(rows[:4])
    assert again.tripped["last_healthy"] == 5 and "guard/alert" not in again.observe(rows[4])


def test_a_rule_without_its_signal_says_so_once_and_is_counted_at_every_evaluation():
    # caught: a missing signal counted as "not crossed" without a word (per_prompt 1 has
    # no diversity, a recipe without a held-out scorer no drift)
    said = []
    guard = Guard(
        GuardConfig(
            action="alert",
            rules=[
                GuardRule(signal="health/high_freq", rises_by=0.02),
                GuardRule(signal="health/diversity", falls_by=0.03),
                GuardRule(signal="drift/diverging", above=0.5),
            ],
        ),
        say=said.append,
    )
    first = {"iteration": 0, "eval/health/high_freq": 0.1}  # the base: no change, no drift
    assert guard.observe(first)["guard/missing"] == 0 and not said
    out = guard.observe(_row(5, **{"health/high_freq": COLD}))
    assert out["guard/missing"] == 2 and out[f"guard/rule/{RULE}"] == 0
    assert out["guard/missing/health/diversity falls by 0.03"] == 1
    assert out["guard/missing/drift/diverging above 0.5"] == 1
    assert guard.observe(_row(10, **{"health/high_freq": COLD}))["guard/missing"] == 2
    assert len(said) == 2  # once per rule, not once per evaluation
    assert "train.eval.per_prompt is 1" in said[0]
    assert "no held-out scorer" in said[1]


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
    cold, falling = (0.0, -0.01, 0.01), (-0.1, -0.2, -0.05)
    rows = [
        _row(**{"health/high_freq": HOT, "health/diversity": cold}),
        _row(**{"health/high_freq": cold, "health/diversity": falling}),
        _row(**{"health/high_freq": HOT, "health/diversity": cold}),
    ]
    assert [guard.observe(r)["guard/streak"] for r in rows] == [1, 1, 1]
    assert guard.tripped is None
    assert guard.observe(rows[0])["guard/stop"] == 1  # texture twice in a row
    assert guard.tripped["rules"] == [RULE]
    # replayed with the guard off: never tripped, but the reading is the same
    off = Guard(GuardConfig(action="off", patience=2, rules=guard.cfg.rules))
    off.replay([*rows, rows[0]])
    assert off.tripped is None
    assert [r["trips"] for r in off.replayed([*rows, rows[0]])] == [False, False, False, True]


def test_guard_rules_take_exactly_one_test_and_name_the_field():
    with pytest.raises(ConfigError, match="exactly one of rises_by, falls_by, rises_rel"):
        load_config(None, ["train.guard.rules=[{signal: health/diversity}]"])
    with pytest.raises(ConfigError, match="got rises_by, above"):
        load_config(None, ["train.guard.rules=[{signal: s, rises_by: 1, above: 2}]"])
    falls = _guard(falls_by=0.02)
    assert falls.observe(_row(**{"health/high_freq": (-0.1, -0.2, -0.03)}))["guard/crossed"]
    below = _guard(below=0.6)
    assert below.observe(_row(**{"health/high_freq": (0, 0, 0)}))["guard/crossed"]  # mean 0.5


def test_relative_rules_compare_the_change_with_the_base_s_own_mean():
    # caught: thresholds were absolute tiny-world numbers; a saturation of 0.25 rising by
    # 0.03 (+12%) and one of 0.8 rising by as much (+4%) read the same
    rises = _guard(rises_rel=0.1)
    # mean now 0.5, change 0.05 -> the base's mean was 0.45; CI low 0.04 < 10% of 0.45
    assert not rises.observe(_row(**{"health/high_freq": (0.05, 0.04, 0.06)}))["guard/crossed"]
    # change 0.25 -> base 0.25; CI low 0.03 > 10% of 0.25
    assert rises.observe(_row(**{"health/high_freq": (0.25, 0.03, 0.3)}))["guard/crossed"]
    falls = _guard(falls_rel=0.2)
    # change -0.5 -> base 1.0; CI high -0.3 < -20% of 1.0
    assert falls.observe(_row(**{"health/high_freq": (-0.5, -0.6, -0.3)}))["guard/crossed"]
    assert not falls.observe(_row(**{"health/high_freq": (-0.5, -0.6, -0.1)}))["guard/crossed"]
    assert GuardRule(signal="health/saturation", rises_rel=0.15).describe() == (
        "health/saturation rises rel 0.15"
    )


def test_rules_follow_the_image_size_unless_given():
    # caught: every recipe took the tiny world's 32² thresholds whatever it trained at
    tiny = load_config("configs/tiny.yaml").train.guard.rules
    assert "health/base_distance rises by 0.07" in [r.describe() for r in tiny]
    flux = load_config("configs/flux_hps_8gpu.yaml").train.guard
    names = [r.describe() for r in flux.rules]
    assert flux.action == "alert"
    assert any(n.startswith("health/saturation rises rel") for n in names)
    assert any(n.startswith("health/sharpness rises by") for n in names)
    given = load_config(
        "configs/flux_hps_8gpu.yaml",
        ["train.guard.rules=[{signal: health/contrast, rises_rel: 0.3}]"],
    )
    assert [r.describe() for r in given.train.guard.rules] == ["health/contrast rises rel 0.3"]


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


def test_pruning_keeps_the_checkpoint_of_the_last_healthy_evaluation(tmp_path):
    # caught: train.checkpoints.keep deleted every checkpoint older than the newest two, so a
    # run that went on after the alarm had nothing healthy left to roll back to
    from g2rpo.run_directory.files import prune_checkpoints
    from g2rpo.run_directory.healthy import kept_for_health, note_guard_reading, read_healthy

    (tmp_path / "checkpoints").mkdir()
    cfg = load_config(None, ["train.checkpoints.keep=2"])

    def save(done):
        (tmp_path / "checkpoints" / f"it_{done:05d}.pt").write_bytes(b"x")
        prune_checkpoints(tmp_path, cfg, also_keep=kept_for_health(tmp_path))

    def evaluated(it, crossed, tripped=None):
        note_guard_reading(tmp_path, {"iteration": it, "guard/crossed": crossed}, tripped)

    save(10)
    evaluated(15, 0)  # healthy: the newest checkpoint at or before 15 is it_00010
    save(20)
    evaluated(25, 1)
    save(30)
    evaluated(35, 1, tripped={"iteration": 35, "rules": [RULE], "last_healthy": 15})
    save(40)
    save(50)
    evaluated(55, 0)  # healthy again after the alarm: the mark stays where the alarm left it
    save(60)
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert kept == ["it_00010.pt", "it_00050.pt", "it_00060.pt"]
    healthy = read_healthy(tmp_path)
    assert healthy["checkpoint"] == "it_00010.pt" and healthy["tripped"]["iteration"] == 35


def test_calibration_fits_each_rule_above_what_clean_runs_held_twice_in_a_row():
    from g2rpo.evaluation.guard_calibration import calibrate, held_level, rules_yaml

    def run(lows):
        return [
            _row(i, **{"health/high_freq": (lo + 0.01, lo, lo + 0.02)}) for i, lo in enumerate(lows)
        ]

    # 0.02 held twice at most (the single 0.05 is not a pair): 1.5 × 0.02 = 0.03 -> 0.05
    assert held_level(run([0.0, 0.05, 0.0, 0.02, 0.02]), "health/high_freq", "rises_by") == 0.02
    out = calibrate({"a": run([0.0, 0.05, 0.0, 0.02, 0.02]), "b": run([0.001, 0.003])})
    assert [r.describe() for r in out["rules"] if "high_freq" in r.signal] == [
        "health/high_freq rises by 0.05"
    ]
    assert out["levels"]["health/high_freq rises_by"] == {"a": 0.02, "b": 0.001}
    assert "no clean run records it" in out["left_out"]["health/sharpness rises_by"]
    # a clean run that moved more than any candidate allows: the rule is left out, said so
    loud = calibrate({"a": run([0.2, 0.2])})
    assert "above every candidate" in loud["left_out"]["health/high_freq rises_by"]
    assert "signal: health/high_freq, rises_by: 0.05" in rules_yaml(out["rules"])
    loaded = load_config(None, ["train.guard.rules=" + repr([
        {"signal": r.signal, "rises_by": r.rises_by} for r in out["rules"] if r.rises_by
    ])])  # fmt: skip
    assert loaded.train.guard.rules[0].rises_by == 0.05


def test_the_photograph_rules_are_the_photograph_check_s_thresholds_rounded_up():
    # the defaults of every GPU recipe: docs/results/hacking/photos's calibration, per size
    import math

    from g2rpo.common.config.guard_defaults import PHOTO_THRESHOLDS, photograph_rules

    def up(x):  # to 2 significant digits, never below
        if x <= 0:
            return 0.0
        e = math.floor(math.log10(x)) - 1
        return round(math.ceil(x / 10**e) * 10**e, 10)

    results = json.loads(Path("docs/results/hacking/photos/results.json").read_text())
    for side, fitted in results["per_size"].items():
        want = {m: up(t) for m, t in fitted["thresholds"].items()}
        want["diversity"] = up(fitted["groups"]["threshold"])
        assert PHOTO_THRESHOLDS[int(side)] == want, side
    at_720 = {r.describe() for r in photograph_rules(720)}
    assert "health/saturation rises rel 0.067" in at_720
    assert "health/diversity falls rel 0.33" in at_720
    assert "health/sharpness rises by 0.043" in at_720
    assert {r.describe() for r in photograph_rules(1000)} != at_720  # 1024's


def test_every_shipped_gpu_recipe_records_what_its_guard_reads():
    # caught: every GPU recipe evaluated one sample a prompt (no diversity), served only its
    # trained rewards (no drift) and shipped the guard off (issue 57); the rehearsal of
    # configs/flux_hps.yaml (tests/test_rehearse.py) shows the signals recorded at each
    # evaluation, every recipe's evaluation taking the same path

    from g2rpo.common.health.image_health import AGAINST_BASE, PER_IMAGE
    from g2rpo.reward_server.scorers.registry import EMBEDDING_SCORERS

    recorded = {f"health/{m}" for m in (*PER_IMAGE, *AGAINST_BASE, "diversity_embed")}
    recipes = [p for p in sorted(Path("configs").glob("*.yaml")) if not p.name.startswith("tiny")]
    assert len(recipes) >= 25
    for path in recipes:
        cfg = load_config(path)
        t = cfg.train
        served = [s.split("=")[0] for s in t.reward.scorers]
        held_out = set(served) - {r.name for r in cfg.rewards}
        assert t.eval.per_prompt >= 2, path
        assert held_out & set(EMBEDDING_SCORERS), (path, served)
        assert t.guard.action == "alert", path
        for rule in t.guard.rules:
            assert rule.signal in recorded or rule.signal == "drift/diverging", (path, rule)
        assert {r.signal for r in t.guard.rules} >= {"health/saturation", "drift/diverging"}


def test_export_healthy_writes_the_checkpoint_healthy_json_names(tmp_path):
    # caught: there was no way to get the weights of the last healthy evaluation out of a
    # run that trained on after the alarm (g2rpo export, --checkpoint healthy)
    import torch
    from g2rpo.common.errors import ModelPathError
    from g2rpo.common.families.registry import family_class
    from g2rpo.evaluation.export_weights import export_checkpoint

    world = Path("assets/shapes-world/pipeline").resolve()
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(f"model: {{pretrained: {world}}}\n")
    with pytest.raises(ModelPathError, match=r"healthy\.json does not exist"):
        export_checkpoint(run, "healthy", tmp_path / "none")
    cls = family_class(load_config(run / "config.yaml")).transformer_class()
    state = cls.from_pretrained(world / "transformer").state_dict()
    moved = {k: v + 1.0 if v.is_floating_point() else v for k, v in state.items()}
    torch.save({"transformer": moved}, run / "checkpoints" / "it_00004.pt")
    torch.save({"transformer": state}, run / "checkpoints" / "it_00008.pt")
    (run / "healthy.json").write_text(json.dumps({"iteration": 6, "checkpoint": "it_00004.pt"}))
    out = export_checkpoint(run, "healthy", tmp_path / "healthy")
    exported = cls.from_pretrained(out).state_dict()
    assert all(torch.equal(exported[k], moved[k]) for k in moved)  # it_00004's, not the last
    (run / "checkpoints" / "it_00004.pt").unlink()  # pruned by hand: said, not guessed
    with pytest.raises(ModelPathError, match="no checkpoint at or before it is left"):
        export_checkpoint(run, "healthy", tmp_path / "again")
