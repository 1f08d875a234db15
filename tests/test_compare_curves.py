"""Training-time evaluations read at fixed NFEs (budget.curve_at_nfe): known answers."""

import math

import pytest
from g2rpo.evaluation.compare_curves import change_at_nfe, curves_at_nfe
from g2rpo.evaluation.compare_results import curves_table
from g2rpo.evaluation.compare_spec import BudgetSpec
from pydantic import ValidationError


def _evals(points):
    """Training-time evaluations at (nfe, scores) points, iteration order."""
    return [{"nfe_train_total": n, "scores": {"r": s}} for n, s in points]


def test_change_at_nfe_is_linear_between_evaluations_and_relative_to_iteration_0():
    evs = _evals([(0, [0.4, 0.6]), (100, [0.7, 0.7]), (200, [0.6, 0.6])])
    assert change_at_nfe(evs, "r", 100) == pytest.approx(0.2)
    assert change_at_nfe(evs, "r", 50) == pytest.approx(0.1)
    assert change_at_nfe(evs, "r", 150) == pytest.approx(0.15)
    assert change_at_nfe(evs, "r", 200) == pytest.approx(0.1)
    assert change_at_nfe(evs, "r", 201) is None  # not reached
    assert change_at_nfe(evs[1:], "r", 150) is None  # no iteration-0 evaluation
    assert change_at_nfe(evs, "other", 100) is None  # not scored
    # a run stops short of its budget (the next iteration would pass it): a mark at or
    # past the comparison's budget is its last evaluation
    assert change_at_nfe(evs, "r", 210, budget=210) == pytest.approx(0.1)
    assert change_at_nfe(evs, "r", 150, budget=210) == pytest.approx(0.15)


def test_curves_at_nfe_means_over_seeds_and_pairs_the_reference_per_seed():
    # reference "a" gains 0.3, 0.4, 0.5 by NFE 100; "b" gains 0.2, 0.2, 0.2: a − b = 0.1, 0.2, 0.3
    evaluations = {}
    for seed, (ga, gb) in enumerate([(0.3, 0.2), (0.4, 0.2), (0.5, 0.2)]):
        evaluations["a", seed] = _evals([(0, [0.5]), (100, [0.5 + ga])])
        evaluations["b", seed] = _evals([(0, [0.5]), (100, [0.5 + gb])])
    evaluations["b", 3] = _evals([(0, [0.5]), (100, [0.9])])  # no reference run: unpaired
    out = curves_at_nfe(evaluations, ["a", "b"], "a", ["r"], [100])
    a = out["methods"]["a"]["r"]["100"]
    assert a["mean"] == pytest.approx(0.4) and a["n"] == 3
    half = 0.1 / math.sqrt(3) * 4.302652729911275  # sd 0.1, t(0.975, 2 d.o.f.)
    assert (a["lo"], a["hi"]) == pytest.approx((0.4 - half, 0.4 + half))
    assert out["methods"]["b"]["r"]["100"]["mean"] == pytest.approx((0.6 + 0.4) / 4)
    diff = out["vs_reference"]["b"]["r"]["100"]
    assert diff["mean"] == pytest.approx(0.2) and diff["n"] == 3
    assert (diff["lo"], diff["hi"]) == pytest.approx((0.2 - half, 0.2 + half))
    table = "\n".join(curves_table(out, {"a": "A", "b": "B"}, "a"))
    assert "| r at 100 NFEs |" in table
    assert f"| A | 3 | +0.4000 [{0.4 - half:+.4f}, {0.4 + half:+.4f}] |" in table
    # its CI holds zero; mean 0.2, sd 0.1 resolve at 4 seeds (t(0.975, 3) · 0.1 / 2 < 0.2)
    assert diff["seeds_to_resolve"] == 4
    assert f"| A − B | | +0.2000 [{0.2 - half:+.4f}, {0.2 + half:+.4f}] (4 seeds) |" in table


def test_a_mark_below_1_or_past_the_budget_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match="curve_at_nfe"):
        BudgetSpec(nfe=10, curve_at_nfe=[0, 5])
    with pytest.raises(ValidationError, match=r"curve_at_nfe: every mark must be ≤ nfe \(10\)"):
        BudgetSpec(nfe=10, curve_at_nfe=[5, 11])
    assert BudgetSpec(nfe=10, curve_at_nfe=[5, 10]).curve_at_nfe == [5, 10]
