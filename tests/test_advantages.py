import pytest
import torch
from g2rpo.common.algorithms.advantages import (
    fuse_g2rpo_advantages,
    fuse_terminal_advantages,
    group_normalize,
    shuffle_within_groups,
)


@pytest.mark.parametrize("value", [0.1, 0.3, 1 / 3, 7.25])
def test_constant_rewards_give_exactly_zero(value):
    r = torch.full((12,), value, dtype=torch.float32)
    # the naive (r - mean)/(std + 1e-8) is 0.58-0.82, not 0, for 0.1, 0.3, 1/3 in fp32
    assert torch.equal(group_normalize(r), torch.zeros(12, dtype=torch.float64))
    grid = torch.full((2, 3, 2, 12), value, dtype=torch.float32)
    assert torch.equal(
        fuse_g2rpo_advantages({"r": grid}, {"r": 1.0}), torch.zeros(2, 3, 12, dtype=torch.float64)
    )
    assert torch.equal(
        fuse_terminal_advantages({"r": grid[:, 0, 0]}, {"r": 1.0}),
        torch.zeros(2, 12, dtype=torch.float64),
    )


def test_known_small_example():
    assert group_normalize(torch.tensor([1.0, 2.0, 3.0])).tolist() == pytest.approx([-1, 0, 1])
    # two granularities [1,2,3] and [3,2,1] cancel
    grid = torch.tensor([[[[1.0, 2, 3], [3, 2, 1]]]])  # [P=1, K=1, J=2, G=3]
    assert torch.equal(
        fuse_g2rpo_advantages({"r": grid}, {"r": 1.0}), torch.zeros(1, 1, 3, dtype=torch.float64)
    )


def test_per_group_standardisation_and_sum_over_granularity():
    torch.manual_seed(0)
    grid = torch.rand(2, 4, 3, 12)
    z = group_normalize(grid, dim=-1)
    assert torch.allclose(z.mean(-1), torch.zeros(2, 4, 3, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(z.std(-1), torch.ones(2, 4, 3, dtype=torch.float64), atol=1e-6)
    fused = fuse_g2rpo_advantages({"r": grid}, {"r": 1.0}, adv_clip=100)
    assert torch.allclose(fused, z.sum(2))
    assert torch.allclose(fused.mean(-1), torch.zeros(2, 4, dtype=torch.float64), atol=1e-12)
    # one granularity: plain GRPO advantage
    assert torch.allclose(fuse_g2rpo_advantages({"r": grid[:, :, :1]}, {"r": 1.0}), z[:, :, 0])
    # permuting members permutes advantages
    perm = torch.randperm(12)
    assert torch.allclose(
        fuse_g2rpo_advantages({"r": grid[..., perm]}, {"r": 1.0}),
        fuse_g2rpo_advantages({"r": grid}, {"r": 1.0})[..., perm],
    )


def test_clamp_after_summation():
    # one outlier among 12: z = 11/sqrt(12) = 3.175 per granularity; 3 of them sum to 9.5
    grid = torch.zeros(1, 1, 3, 12)
    grid[..., 0] = 1.0
    grid[..., 1] = -0.0  # keep the others equal
    fused = fuse_g2rpo_advantages({"r": grid}, {"r": 1.0}, adv_clip=5.0)
    assert fused[0, 0, 0].item() == 5.0
    single = group_normalize(grid[0, 0, 0])
    assert single[0].item() == pytest.approx(11 / 12**0.5)
    assert fused[0, 0, 1:].tolist() == pytest.approx((3 * single[1:]).tolist())


def test_reward_weights():
    torch.manual_seed(1)
    a, b = torch.rand(1, 2, 2, 6), torch.rand(1, 2, 2, 6)
    both = fuse_g2rpo_advantages({"a": a, "b": b}, {"a": 2.0, "b": 0.5}, adv_clip=100)
    expect = 2 * group_normalize(a).sum(2) + 0.5 * group_normalize(b).sum(2)
    assert torch.allclose(both, expect)
    with pytest.raises(ValueError, match="weight"):
        fuse_g2rpo_advantages({"a": a}, {})
    with pytest.raises(ValueError, match=r"\[P, K, J, G\]"):
        fuse_g2rpo_advantages({"a": a, "b": b[..., :3]}, {"a": 1, "b": 1})


def test_terminal_advantages_flow_grpo_variant():
    r = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    pop = fuse_terminal_advantages({"r": r}, {"r": 1.0}, unbiased=False, eps=1e-4)
    expect = (r - 2.5) / (r.std(unbiased=False) + 1e-4)
    assert torch.allclose(pop, expect.double())
    glob = fuse_terminal_advantages(
        {"r": torch.cat([r, 2 * r])}, {"r": 1.0}, unbiased=False, eps=0.0, global_std=True
    )
    allr = torch.cat([r, 2 * r]).double()
    assert torch.allclose(glob, (allr - allr.mean(-1, keepdim=True)) / allr.std(unbiased=False))


def test_shuffle_is_a_permutation_within_each_group():
    adv = torch.arange(24, dtype=torch.float64).reshape(2, 12)
    out = shuffle_within_groups(adv, torch.Generator().manual_seed(0))
    assert not torch.equal(out, adv)
    for row in range(2):
        assert sorted(out[row].tolist()) == adv[row].tolist()


def test_advantage_shares_are_each_rewards_part_of_the_fused_signal():
    from g2rpo.common.algorithms.advantages import advantage_shares, g2rpo_reward_terms

    torch.manual_seed(0)
    a = torch.randn(2, 3, 2, 8)
    # a rescaled reward normalises to the same advantages: the weights set the shares
    terms = g2rpo_reward_terms({"hps": a, "clip": 5 * a + 1}, {"hps": 3.0, "clip": 1.0})
    shares = advantage_shares(terms)
    assert shares["hps"] == pytest.approx(0.75) and shares["clip"] == pytest.approx(0.25)
    assert torch.allclose(
        fuse_g2rpo_advantages({"hps": a, "clip": 5 * a + 1}, {"hps": 3.0, "clip": 1.0}),
        (terms["hps"] + terms["clip"]).clamp(-5, 5),
    )
    # a reward that never spreads inside a group carries no signal
    flat = advantage_shares(
        g2rpo_reward_terms({"hps": a, "const": torch.ones_like(a)}, {"hps": 1.0, "const": 1.0})
    )
    assert flat == {"hps": 1.0, "const": 0.0}
    assert advantage_shares(g2rpo_reward_terms({"c": torch.ones_like(a)}, {"c": 1.0})) == {"c": 0.0}
