import itertools
import math

import pytest
import torch
from g2rpo.common.algorithms.schedules import (
    completion_indices,
    completion_step_count,
    expected_g2rpo_nfe,
    granular_schedule,
    model_timestep,
    sampling_grid,
    sigma_schedule,
    time_shift,
)

# σ grid of the G²RPO defaults (T=16, shift 3) as tabulated from the official code.
SIGMAS_T16 = [
    1.0,
    0.97826,
    0.95455,
    0.92857,
    0.9,
    0.86842,
    0.83333,
    0.79412,
    0.75,
    0.7,
    0.64286,
    0.57692,
    0.5,
    0.40909,
    0.3,
    0.16667,
    0.0,
]
TIMESTEPS_T16 = [1000, 978, 954, 928, 900, 868, 833, 794, 750, 700, 642, 576, 500, 409, 300, 166, 0]


def test_sigma_schedule_matches_reference_table():
    sig = sigma_schedule(16, 3.0)
    assert sig.dtype == torch.float64 and sig.shape == (17,)
    assert torch.allclose(sig, torch.tensor(SIGMAS_T16, dtype=torch.float64), atol=5e-6)
    assert sig[0] == 1.0 and sig[-1] == 0.0


def test_model_timestep_is_floor_of_thousand_sigma_on_the_float32_grid():
    grid = sampling_grid(16, 3.0)
    assert grid.timesteps.dtype == torch.float32
    assert (grid.timesteps * 1000).round().long().tolist() == TIMESTEPS_T16
    assert model_timestep(torch.tensor(0.97826), quantize=False).item() == pytest.approx(0.97826)
    # a tie: σ_8 = 0.6 for T=12; the official float32 grid floors it to 599
    assert round(float(sampling_grid(12, 3.0).timesteps[8]) * 1000) == 599
    assert sampling_grid(12, 3.0).sigmas[8].item() == pytest.approx(0.6, abs=1e-15)
    assert torch.equal(
        sampling_grid(16, 3.0, quantize=False).timesteps, sigma_schedule(16, 3.0).float()
    )


def test_time_shift_properties():
    u = torch.linspace(0, 1, 101, dtype=torch.float64)
    for s in (0.5, 1.0, 3.0, 7.0):
        out = time_shift(u, s)
        assert out[0] == 0 and out[-1] == 1
        assert torch.all(out[1:] > out[:-1])
    assert torch.equal(time_shift(u, 1.0), u)
    # FLUX's exponential shift with mu = ln s: e^mu / (e^mu + (1/t - 1)).
    t = u[1:-1]
    mu = math.log(3.0)
    flux = math.exp(mu) / (math.exp(mu) + (1 / t - 1))
    assert torch.allclose(time_shift(t, 3.0), flux, atol=1e-12)


def test_granularity_one_reproduces_full_schedule():
    for T in (4, 10, 16, 25):
        for k in range(T - 1):
            for terminal in ("exact", "reference"):
                assert granular_schedule(k, 1, T, terminal) == list(range(T + 1))


def test_granularity_two_grids():
    assert granular_schedule(0, 2, 16) == [0, 1, 2, 4, 6, 8, 10, 12, 14, 16]
    # k odd: the coarse grid stops at 15; exact adds 16, reference jumps 13 -> 16.
    assert granular_schedule(1, 2, 16, "exact") == [0, 1, 2, 3, 5, 7, 9, 11, 13, 15, 16]
    assert granular_schedule(1, 2, 16, "reference") == [0, 1, 2, 3, 5, 7, 9, 11, 13, 16]
    assert granular_schedule(5, 3, 16, "reference") == [0, 1, 2, 3, 4, 5, 6, 7, 10, 13, 16]


def test_completion_step_counts_match_official_table():
    # Official per-k steps (g=1 | g=2): 15|8, 14|7, 13|7, 12|6, 11|6, 10|5, 9|5, 8|4.
    g1 = [completion_step_count(k, 1, 16, "reference") for k in range(8)]
    g2 = [completion_step_count(k, 2, 16, "reference") for k in range(8)]
    assert g1 == [15, 14, 13, 12, 11, 10, 9, 8] and sum(g1) == 92
    assert g2 == [8, 7, 7, 6, 6, 5, 5, 4] and sum(g2) == 48
    assert sum(completion_step_count(k, 2, 16, "exact") for k in range(8)) == 52


@pytest.mark.parametrize("terminal", ["exact", "reference"])
def test_closed_form_step_count_equals_schedule_length(terminal):
    for T in range(2, 30):
        for k in range(T - 1):
            for g in range(1, 6):
                nodes = completion_indices(k, g, T, terminal)
                assert nodes[0] == k + 1 and nodes[-1] == T
                assert all(a < b for a, b in itertools.pairwise(nodes))
                assert completion_step_count(k, g, T, terminal) == len(nodes) - 1


def test_expected_nfe_counts_from_the_issue():
    k = list(range(8))
    assert expected_g2rpo_nfe(16, 12, k, [1, 2]) == 1552
    assert expected_g2rpo_nfe(16, 12, k, [1, 2], share_granularity_prefix=False) == 1744
    assert expected_g2rpo_nfe(16, 12, k, [1, 2, 3]) == 1828
    assert expected_g2rpo_nfe(16, 12, k, [1, 2, 3], share_granularity_prefix=False) == 2212
    # closed form: T + G·Σ_k (Σ_g steps(k,g) − 2·(|Λ|−1)) when every grid has ≥ 2 steps
    closed = 16 + 12 * sum(
        sum(completion_step_count(kk, g, 16, "exact") for g in (1, 2, 3)) - 4 for kk in k
    )
    assert closed == 1828
    assert expected_g2rpo_nfe(16, 12, k, [1, 2], num_prompts=3) == 3 * 1552


def test_bad_branch_is_rejected():
    with pytest.raises(ValueError, match="T-2"):
        completion_indices(15, 1, 16)
    with pytest.raises(ValueError, match="granularity"):
        completion_indices(0, 0, 16)
    with pytest.raises(ValueError):
        sigma_schedule(0)
