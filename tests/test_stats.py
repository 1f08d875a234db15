"""Known answers for the evaluation statistics."""

import numpy as np
import pytest
from g2rpo.common.algorithms.stats import (
    across_seeds,
    bootstrap_mean,
    paired_difference,
    per_prompt_means,
)
from g2rpo.evaluation.metrics import pass_from_scores


def test_per_prompt_means_group_consecutive_samples():
    assert per_prompt_means([1, 3, 0, 0, 5, 7], 3).tolist() == [2.0, 0.0, 6.0]
    with pytest.raises(ValueError, match="evenly"):
        per_prompt_means([1, 2, 3], 2)


def test_bootstrap_ci_brackets_the_mean_and_shrinks_with_more_prompts():
    rng = np.random.default_rng(0)
    small = bootstrap_mean(rng.normal(0.3, 1.0, 20))
    large = bootstrap_mean(rng.normal(0.3, 1.0, 2000))
    assert small.lo < small.mean < small.hi
    assert large.hi - large.lo < (small.hi - small.lo) / 5
    # the CI of a large sample covers the true mean and is about ±1.96 σ/√n wide
    assert large.lo < 0.3 < large.hi
    assert abs((large.hi - large.lo) / 2 - 1.96 / np.sqrt(2000)) < 0.01


def test_constant_values_have_a_zero_width_interval():
    iv = bootstrap_mean(np.ones(40))
    assert (iv.mean, iv.lo, iv.hi, iv.n) == (1.0, 1.0, 1.0, 40)
    same = paired_difference([0.2, 0.5, 0.9], [0.2, 0.5, 0.9])
    assert (same.mean, same.lo, same.hi) == (0.0, 0.0, 0.0)
    assert not same.excludes_zero()


def test_paired_difference_is_the_mean_of_differences():
    model, base = np.array([0.6, 0.7, 0.9, 0.8]), np.array([0.5, 0.5, 0.8, 0.8])
    d = paired_difference(model, base)
    assert d.mean == pytest.approx(0.1)
    assert d.lo >= 0.0 and d.hi <= 0.2  # within the per-prompt differences' range
    with pytest.raises(ValueError, match="shape"):
        paired_difference([1, 2], [1, 2, 3])


def test_student_t_interval_over_three_seeds():
    iv = across_seeds([1.0, 2.0, 3.0])
    # mean 2, sem = 1/sqrt(3), t(0.975, 2) = 4.3027
    assert iv.mean == 2.0
    assert iv.hi - iv.mean == pytest.approx(4.302653 / np.sqrt(3), rel=1e-5)
    assert across_seeds([0.5]).lo == 0.5  # one seed: no interval


def test_strict_pass_is_all_three_criteria():
    out = pass_from_scores({"shapes_oracle": [1.0, 2 / 3, 0.0, 1.0], "shapes_clip": [0.9] * 4})
    assert out["shapes_oracle/pass"].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert "shapes_clip/pass" not in out


def test_seeds_to_resolve_is_the_first_n_whose_t_interval_excludes_zero():
    from g2rpo.common.algorithms.stats import seeds_to_resolve

    # mean 2, sd 1: t(2)·1/√3 = 2.48 > 2, t(3)·1/√4 = 1.59 < 2
    assert seeds_to_resolve([1.0, 2.0, 3.0]) == 4
    # mean 0.00833, sd 0.01258: t(n-1)/√n falls under 0.662 first at n = 12 (t(11)/√12 =
    # 0.635, t(10)/√11 = 0.672)
    assert seeds_to_resolve([0.01, -0.005, 0.02]) == 12
    assert seeds_to_resolve([1.0, -1.0]) is None  # mean 0: never
    assert seeds_to_resolve([1e-6, -1.0, 1.0]) is None  # more than 10,000
    assert seeds_to_resolve([0.2, 0.2]) == 2  # no seed variance
    with pytest.raises(ValueError, match="2 seeds"):
        seeds_to_resolve([0.1])
