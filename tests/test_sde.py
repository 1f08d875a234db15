import math

import pytest
import torch
from g2rpo.common.algorithms.schedules import sigma_schedule
from g2rpo.common.algorithms.sde import (
    diffusion_coefficient,
    gaussian_log_prob,
    ode_step,
    sde_step,
    step_coefficients,
    x0_prediction,
)

SIG = sigma_schedule(16, 3.0)
S1 = float(SIG[1])
# Per-step Flow-GRPO std at k = 0..7 for eta = 0.7 (reference table).
FLOW_TAU = [0.700, 0.723, 0.517, 0.427, 0.373, 0.337, 0.310, 0.289]
DANCE_TAU = [0.0442, 0.0462, 0.0483, 0.0507, 0.0533, 0.0562, 0.0594, 0.0630]


def _xv(batch=3, shape=(5, 4), seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(batch, *shape, generator=g, dtype=dtype),
        torch.randn(batch, *shape, generator=g, dtype=dtype),
    )


@pytest.mark.parametrize("sde_type", ["flow", "dance"])
def test_eta_zero_sde_step_is_the_euler_step(sde_type):
    x, v = _xv()
    for k in range(16):
        step = sde_step(
            x, v, SIG[k], SIG[k + 1], 0.0, sde_type=sde_type, sigma_1=S1, noise=torch.randn_like(x)
        )
        euler = x + (SIG[k + 1] - SIG[k]).float() * v
        assert torch.equal(step.sample, euler)
        assert step.log_prob is None
    assert torch.equal(ode_step(x, v, SIG[3], SIG[4]), x + (SIG[4] - SIG[3]).float() * v)


def test_per_step_noise_std_matches_reference_table():
    flow = [float(step_coefficients(SIG[k], SIG[k + 1], 0.7, "flow", S1).std) for k in range(8)]
    dance = [float(step_coefficients(SIG[k], SIG[k + 1], 0.3, "dance", S1).std) for k in range(8)]
    assert flow == pytest.approx(FLOW_TAU, abs=6e-4)
    assert dance == pytest.approx(DANCE_TAU, abs=6e-5)


def test_first_step_closed_form_with_sigma_one_guard():
    eta = 0.7
    c = step_coefficients(SIG[0], SIG[1], eta, "flow", S1)
    assert float(c.std) == pytest.approx(eta, abs=1e-15)
    assert float(c.cx) == pytest.approx(1 - eta**2 / 2, abs=1e-15)  # 0.755
    assert float(c.cv) == pytest.approx(float(SIG[1] - SIG[0]), abs=1e-15)
    assert float(diffusion_coefficient(SIG[0], eta, "flow", S1)) == pytest.approx(4.7476, abs=1e-4)


def test_mean_equals_score_form():
    x, v = _xv(dtype=torch.float64)
    for sde_type, eta in (("flow", 0.7), ("dance", 0.3)):
        for k in range(1, 15):
            s, sn = SIG[k], SIG[k + 1]
            g = diffusion_coefficient(s, eta, sde_type, S1)
            score = -(x + (1 - s) * v) / s
            expect = x + (v - g**2 / 2 * score) * (sn - s)
            got = sde_step(
                x, v, s, sn, eta, sde_type=sde_type, sigma_1=S1, noise=torch.zeros_like(x)
            ).mean
            assert torch.allclose(got, expect, atol=1e-13, rtol=0)


def test_log_prob_closed_form_and_maximum_at_mean():
    mean = torch.randn(2, 6, 7)
    std = torch.tensor([0.3, 0.7], dtype=torch.float64)
    at_mean = gaussian_log_prob(mean, mean, std)
    expect = -torch.log(std) - 0.5 * math.log(2 * math.pi)
    assert torch.allclose(at_mean.double(), expect, atol=1e-6)
    for c in (0.5, 1.0, 2.0):
        shift = c * std.float().reshape(2, 1, 1)
        up, down = (
            gaussian_log_prob(mean + shift, mean, std),
            gaussian_log_prob(mean - shift, mean, std),
        )
        assert torch.allclose(up, at_mean - c * c / 2, atol=1e-5)
        assert torch.allclose(up, down, atol=1e-6)
        assert torch.all(up < at_mean)
    # equals torch.distributions' density averaged over elements
    sample = mean + torch.randn_like(mean)
    ref = torch.distributions.Normal(mean.double(), std.reshape(2, 1, 1)).log_prob(sample.double())
    assert torch.allclose(
        gaussian_log_prob(sample, mean, std).double(), ref.flatten(1).mean(1), atol=1e-5
    )


def test_monte_carlo_moments():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 8, generator=g).expand(100_000, 8).contiguous()
    v = torch.randn(1, 8, generator=g).expand(100_000, 8).contiguous()
    step = sde_step(x, v, SIG[2], SIG[3], 0.7, sigma_1=S1, noise=torch.randn(x.shape, generator=g))
    tau = float(step.std[0])
    assert torch.allclose(step.sample.mean(0), step.mean[0], atol=4 * tau / math.sqrt(1e5))
    assert torch.allclose(step.sample.var(0), torch.full((8,), tau**2), rtol=0.02)


def test_recompute_at_stored_sample_is_bitwise_equal():
    x, v = _xv()
    noise = torch.randn_like(x)
    first = sde_step(x, v, SIG[4], SIG[5], 0.7, sigma_1=S1, noise=noise)
    again = sde_step(x, v, SIG[4], SIG[5], 0.7, sigma_1=S1, prev_sample=first.sample)
    assert torch.equal(first.log_prob, again.log_prob)


def test_gradient_flows_only_through_the_mean():
    torch.manual_seed(0)
    x = torch.randn(2, 6, dtype=torch.float64)
    w = torch.randn(6, 6, dtype=torch.float64, requires_grad=True)
    sample = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)

    def logp(weight):
        return sde_step(
            x, x @ weight, SIG[3], SIG[4], 0.7, sigma_1=S1, prev_sample=sample
        ).log_prob.sum()

    logp(w).backward()
    assert sample.grad is None  # the stored sample is detached
    h = 1e-6
    fd = torch.zeros_like(w)
    for i in range(6):
        for j in range(6):
            e = torch.zeros_like(w)
            e[i, j] = h
            fd[i, j] = (logp(w.detach() + e) - logp(w.detach() - e)) / (2 * h)
    assert torch.allclose(w.grad, fd, atol=1e-6)


def test_x0_prediction_is_one_euler_hop_to_zero():
    x, v = _xv()
    assert torch.equal(x0_prediction(x, v, SIG[13]), ode_step(x, v, SIG[13], 0.0))


def test_bad_steps_are_rejected():
    x, v = _xv()
    with pytest.raises(ValueError, match="decrease"):
        sde_step(x, v, 0.3, 0.5, 0.7, noise=x)
    with pytest.raises(ValueError, match="noise"):
        sde_step(x, v, 0.5, 0.3, 0.7)
    with pytest.raises(ValueError, match="undefined"):
        gaussian_log_prob(x, x, torch.tensor(0.0))
    with pytest.raises(ValueError, match="sde_type"):
        diffusion_coefficient(torch.tensor(0.5), 0.7, "ddim", S1)
