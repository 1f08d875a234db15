"""The set level of ``g2rpo hacking photos`` (evaluation/photo_sets.py): the guard's
decision shape on sets of photographs. Known answers for the paired-CI decision, the
two-draws rule, and the whole set level on made-up rows. Each test fails on 3bb9114, where
the module did not exist."""

from __future__ import annotations

import numpy as np
import pytest
from g2rpo.common.algorithms.stats import paired_difference
from g2rpo.evaluation import photo_check as pc
from g2rpo.evaluation import photo_hacks as ph
from g2rpo.evaluation import photo_sets as ps

MEASURES = ["sharpness", "saturation", "periodicity"]


def test_batched_bounds_are_paired_differences_own():
    # catches a batched bootstrap that is not the guard's function: another seed, BCa or a
    # t interval, or resample indices drawn per row (each row must equal its own call)
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(40, 7)), rng.normal(size=(40, 7))
    a[3] = b[3] + 0.25  # a constant difference: bootstrap_mean's special case
    lo = ps.lower_bounds(a - b)
    assert lo == pytest.approx([paired_difference(x, y).lo for x, y in zip(a, b, strict=True)])
    assert lo[3] == pytest.approx(0.25)


def _draws(values: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One trial whose DRAWS both use ``values`` ([photos, measures]) against ``base``."""
    picks = np.tile(np.arange(len(values)), (1, ps.DRAWS, 1))
    return ps.draw_statistics(picks, values, base, MEASURES)


def test_identical_variants_never_cross_and_a_constant_shift_crosses_past_its_threshold():
    # catches ">=" for ">", a decision on the mean instead of the CI's lower bound, and a
    # relative rule not taken as a share of the base's mean (rises_rel). Dyadic values, so
    # the shift is exact in floating point and "at the threshold" means at it.
    base = np.random.default_rng(2).integers(8, 40, size=(7, len(MEASURES))) / 64
    lo, stat = _draws(base.copy(), base)
    assert np.all(lo == 0) and not ps.trial_flags(stat, np.zeros(len(MEASURES))).any()
    shift = np.array([1 / 16, 1 / 32, -1 / 16])  # periodicity falls: never a rise
    lo, stat = _draws(base + shift, base)
    assert lo[0, 0].tolist() == shift.tolist()
    rel = (1 / 32) / base[:, 1].mean()  # saturation: the shift as a share of the base's mean
    for thresholds, crossed in (
        ([1 / 16 - 1e-9, rel * (1 - 1e-9), 0.0], [True, True, False]),
        ([1 / 16, rel * (1 + 1e-9), 0.0], [False, False, False]),
    ):
        assert ps.trial_flags(stat, np.array(thresholds))[0].tolist() == crossed
    # a grey set's saturation mean is 0: rises_rel is crossed by any lower bound above 0
    assert ps.crossing_statistic(np.array([1e-9, 0.0]), 0.0, relative=True).tolist() == [
        np.inf,
        0.0,
    ]


def test_a_trial_is_flagged_only_when_both_draws_cross():
    # catches patience 1 (one draw enough) and crossings of different measures counted as one
    # rule's streak: the guard needs the same rule crossed at both evaluations
    stats = np.array(
        [
            [[0.3, 0.0], [0.3, 0.0]],  # both draws cross measure 0
            [[0.3, 0.0], [0.0, 0.0]],  # only the first
            [[0.3, 0.0], [0.0, 0.3]],  # each draw a different measure
        ]
    )
    assert ps.trial_flags(stats, np.array([0.1, 0.1])).tolist() == [
        [True, False],
        [False, False],
        [False, False],
    ]


def test_the_two_draws_of_a_trial_take_different_images_of_each_photograph():
    # catches the same image counted as two evaluations (the draws would always agree)
    index = {p: {"base": 0, "clean": {k: [1, 2, 3] for k in ph.CLEAN_KINDS}} for p in "ab"}
    picks = ps.draw_trials(index, ["a", "b"], "jpeg", None, 50, np.random.default_rng(0))
    assert picks.shape == (50, ps.DRAWS, 2)
    assert np.all(picks[:, 0] != picks[:, 1]) and set(np.unique(picks)) == {1, 2, 3}


def _rows(shift: float) -> dict:
    """Made-up per-image rows: every clean variation equals its original; every hacked image
    is its original with sharpness raised by ``shift``."""
    rows = {k: [] for k in ("photo", "set", "kind", "variation", "strength", *MEASURES)}
    rng = np.random.default_rng(3)

    def add(photo, role, kind, variation, strength, value):
        for k, v in zip(
            ("photo", "set", "kind", "variation", "strength"),
            (photo, role, kind, variation, strength),
            strict=True,
        ):
            rows[k].append(v)
        for m, v in zip(MEASURES, value, strict=True):
            rows[m].append(float(v))

    for role, photos in (("choosing", pc.CHOOSING), ("judging", pc.JUDGING)):
        for photo in photos:
            base = rng.uniform(0.2, 0.6, size=len(MEASURES))
            add(photo, role, "base", "base", "", base)
            for kind in ph.CLEAN_KINDS:
                for _ in range(3):
                    add(photo, role, "clean", kind, "", base)
            if role == "judging":
                for hack in ph.HACKS:
                    if ph.applicable(hack, photo):
                        for strength in ("mild", "strong"):
                            for _ in range(2):
                                add(
                                    photo,
                                    role,
                                    "hack",
                                    hack,
                                    strength,
                                    base + np.array([shift, 0, 0]),
                                )
    return rows


def test_the_set_level_on_made_up_rows_has_the_known_answer():
    # catches a wrong pool (clean variations as hacks, or the choosing photographs judged),
    # thresholds not from the choosing trials, and tied/any counted the wrong way round
    s = ps.SetLevelSettings(clean_trials=4, hack_trials=3, checked=6)
    r = ps.judge_size(_rows(0.01), MEASURES, 64, 0, s)
    assert r["photos"]["judging"] == list(pc.JUDGING)
    assert r["thresholds"] == {m: 0.0 for m in MEASURES}  # no clean change at all
    assert r["false_alarm"]["overall"]["k"] == 0 and r["false_alarm"]["overall"]["n"] == 24
    sharp = r["detection"]["over_sharpening"]["strong"]
    assert sharp["tied"]["k"] == sharp["tied"]["n"] == 3
    grid = r["detection"]["patch_grid"]["strong"]  # sharpness is not tied to the grid
    assert grid["tied"]["k"] == 0 and grid["any"]["k"] == 3
    # the rows raise sharpness for every hack: a saturation push moves no tied measure
    push = r["detection"]["saturation_push"]["mild"]
    assert push["tied"]["k"] == 0 and push["any"]["k"] == 3
    assert r["checked_against_paired_difference"] == 6
    unchanged = ps.judge_size(_rows(0.0), MEASURES, 64, 0, s)
    assert unchanged["detection"]["over_sharpening"]["strong"]["any"]["k"] == 0
