import pytest
import torch
from g2rpo.common.algorithms.ppo import kl_to_reference, ppo_clip_loss


def test_ratio_one_gives_minus_mean_advantage_and_policy_gradient():
    lp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    adv = torch.tensor([1.0, -2.0, 0.5])
    stats = ppo_clip_loss(lp, lp.detach().clone(), adv, 1e-4)
    assert torch.equal(stats.ratio, torch.ones(3))
    assert stats.loss.item() == pytest.approx(-adv.mean().item())
    stats.loss.backward()
    assert torch.allclose(lp.grad, -adv / 3)
    assert not stats.clipped.any()


@pytest.mark.parametrize(("adv", "delta"), [(1.0, 0.01), (-1.0, -0.01)])
def test_clipped_region_has_zero_gradient(adv, delta):
    old = torch.tensor([0.0])
    lp = torch.tensor([delta], requires_grad=True)  # ratio beyond 1 ± eps
    stats = ppo_clip_loss(lp, old, torch.tensor([adv]), 1e-4)
    stats.loss.backward()
    assert lp.grad.item() == 0.0
    assert stats.clipped.all()


@pytest.mark.parametrize(("adv", "delta"), [(1.0, -0.01), (-1.0, 0.01)])
def test_unfavourable_side_is_not_clipped(adv, delta):
    lp = torch.tensor([delta], requires_grad=True)
    ppo_clip_loss(lp, torch.tensor([0.0]), torch.tensor([adv]), 1e-4).loss.backward()
    assert lp.grad.item() == pytest.approx(-adv * torch.exp(torch.tensor(delta)).item())


def test_loss_non_increasing_in_clipped_region():
    adv = torch.tensor([1.0])
    losses = [
        ppo_clip_loss(torch.tensor([d]), torch.tensor([0.0]), adv, 0.1).loss.item()
        for d in (0.2, 0.3, 0.5)
    ]
    assert losses[0] == losses[1] == losses[2]


def test_kl_zero_iff_means_equal():
    m = torch.randn(3, 4, 5)
    g = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    assert torch.equal(kl_to_reference(m, m, g), torch.zeros(3))
    other = m + 0.1
    kl = kl_to_reference(m, other, g)
    assert torch.allclose(kl, 0.01 / (2 * g.float() ** 2))


def test_bad_clip_range():
    with pytest.raises(ValueError, match="clip_range"):
        ppo_clip_loss(torch.zeros(1), torch.zeros(1), torch.zeros(1), 0.0)
