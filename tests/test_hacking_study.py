"""The hacking study's rule choice on recorded rows: the most sensitive threshold that
stops no clean run of the choosing seeds, kept when it stops a hacked one; judged on
the held-out seeds' runs."""

import json

import yaml
from g2rpo.evaluation.hacking_study import choose_rules, main, trip_of


def _rows(high_freq_lo: list[float], shift_lo: list[float] | None = None) -> list[dict]:
    """Evaluation rows (iterations 0, 10, 20, ...) with the paired changes' lower bounds."""
    rows = [{"iteration": 0, "eval/health/high_freq": 0.01}]
    shift_lo = shift_lo or [0.0] * len(high_freq_lo)
    for i, (lo, s) in enumerate(zip(high_freq_lo, shift_lo, strict=True), start=1):
        rows.append(
            {
                "iteration": 10 * i,
                "eval/health/high_freq/delta": lo + 0.01,
                "eval/health/high_freq/delta_lo": lo,
                "eval/health/high_freq/delta_hi": lo + 0.02,
                "eval/health/background_shift/delta": s,
                "eval/health/background_shift/delta_lo": s,
                "eval/health/background_shift/delta_hi": s + 0.01,
            }
        )
        rows.append({"iteration": 10 * i + 1, "loss": 0.0})  # no evaluation
    return rows


RUNS = {
    # texture from iteration 20 on; the clean run's texture wobbles up to 0.004
    "textured-s0": _rows([0.0, 0.03, 0.06, 0.08]),
    "clean-s0": _rows([0.004, 0.003, 0.004, 0.001]),
    "textured-s1": _rows([0.0, 0.0, 0.02, 0.07]),
    "clean-s1": _rows([0.006, 0.007, 0.0, 0.0]),
}
LABELS = {
    "textured-s0": {"hack": "dots", "seen_at": 30},
    "clean-s0": {"hack": None},
    "textured-s1": {"hack": "dots", "seen_at": 40},
    "clean-s1": {"hack": None},
}


def test_rules_are_chosen_on_the_choosing_seeds_only():
    rules = choose_rules(RUNS, LABELS, {0})
    # 0.002 and 0.005... : 0.002 stops clean-s0 (0.003, 0.004 in a row); 0.005 does not
    assert [r.describe() for r in rules] == ["health/high_freq rises by 0.005"]
    assert trip_of(RUNS["textured-s0"], rules) == 30
    # held out: the clean run of seed 1 wobbles higher and is stopped (a false alarm)
    assert trip_of(RUNS["clean-s1"], rules) == 20
    assert trip_of(RUNS["textured-s1"], rules) == 40


def test_the_study_writes_its_results_and_table(tmp_path):
    runs = tmp_path / "runs"
    for name, rows in RUNS.items():
        (runs / name / "samples").mkdir(parents=True)
        (runs / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        from PIL import Image

        for it in (0, 10, 20):
            Image.new("RGB", (8, 6), "red").save(runs / name / "samples" / f"it_{it:05d}.png")
    (tmp_path / "labels.yaml").write_text(yaml.safe_dump({**LABELS, "choose_seeds": [0]}))
    assert main([str(runs), str(tmp_path / "labels.yaml"), str(tmp_path / "out")]) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    verdicts = {n: r["verdict"] for n, r in results["runs"].items()}
    assert verdicts == {
        "clean-s0": "left alone",
        "clean-s1": "false alarm",
        "textured-s0": "caught",
        "textured-s1": "caught",
    }
    assert results["runs"]["textured-s1"]["lead_iterations"] == 0
    assert (
        "| textured-s1 | held out | dots (40) | 40 | caught |"
        in (tmp_path / "out" / "table.md").read_text()
    )
    from PIL import Image

    montage = Image.open(tmp_path / "out" / "grids" / "clean-s0.png")
    assert montage.size == (8 + 8, 6)  # iterations 0 and 20 (every third, and the last)
    # the runs' own grids are left as they were
    assert all(Image.open(p).size == (8, 6) for p in runs.glob("*/samples/*.png"))
