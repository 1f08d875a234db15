"""Trajectory batches reach a learner rank without private copies: pickled as NumPy
arrays they are views of Ray's object store (shared by a node's ranks), and merging
workers' batches stacks their sample tensors instead of concatenating them."""

import copy
import pickle

import psutil
import pytest
import ray
import torch
from conftest import ElementwiseVelocity, toy_cond
from g2rpo.common.algorithms.schedules import sampling_grid
from g2rpo.common.config.loading import load_config
from g2rpo.common.wire.shared_tensors import SHARE_FROM_BYTES, from_wire, to_wire
from g2rpo.common.wire.trajectories import Trajectories, Transitions
from g2rpo.learner.advantages import plan_advantages
from g2rpo.learner.batches import RowStack, merge
from g2rpo.learner.grpo import StepSpec, grpo_update
from g2rpo.rollout_worker.engine import RolloutEngine, draw_noise
from g2rpo.rollout_worker.plan import g2rpo_plan

T = 8


def test_a_row_stack_gathers_the_rows_a_concatenation_would_hold():
    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(n, 2, 3, generator=g) for n in (3, 5, 1, 4)]
    whole, stack = torch.cat(parts), RowStack(parts)
    assert stack.shape == whole.shape and len(stack) == 13 and stack.dtype == whole.dtype
    rows = torch.tensor([12, 0, 3, 3, 8, 7, 2, 11])  # out of order, repeated, every part
    assert torch.equal(stack[rows], whole[rows])
    mask = torch.rand(13, generator=g) > 0.5
    assert torch.equal(stack[mask], whole[mask])
    assert stack[torch.tensor([], dtype=torch.long)].shape == (0, 2, 3)
    with pytest.raises(IndexError, match=r"0\.\.12"):
        stack[torch.tensor([13])]
    with pytest.raises(ValueError, match="shapes"):
        RowStack([torch.zeros(2, 3), torch.zeros(2, 4)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_large_tensors_round_trip_through_the_wire_form_and_small_ones_stay(dtype):
    big = torch.randn(SHARE_FROM_BYTES // 2 + 7, dtype=torch.float32).to(dtype)
    small = torch.arange(10)
    wire = pickle.loads(pickle.dumps(to_wire({"big": big, "small": small})))
    assert type(wire["small"]) is torch.Tensor
    assert type(wire["big"]) is not torch.Tensor  # the shareable form
    back = from_wire(wire)
    assert back["big"].dtype == dtype and torch.equal(back["big"], big)
    assert torch.equal(back["small"], small)


def _trajectories(worker: int, seed: int, P: int = 2, G: int = 4) -> Trajectories:
    model = ElementwiseVelocity((4, 3))
    plan = g2rpo_plan(P, T, G, [0, 2], [1, 2])
    init, sde = draw_noise(plan, (4, 3), torch.Generator().manual_seed(seed))
    cond = toy_cond(P, seed=seed)
    with torch.no_grad():
        result = RolloutEngine(model, sampling_grid(T)).run(plan, cond, init, sde)
    rewards = torch.rand(len(plan.leaves), generator=torch.Generator().manual_seed(seed))
    return Trajectories(
        worker=worker,
        iteration=0,
        version=0,
        prompts=[f"p{i}" for i in range(P)],
        plan=plan,
        transitions=result.transitions,
        cond=cond,
        leaf_rewards={"r": rewards},
        nfe=result.nfe,
        model_calls=result.model_calls,
    )


def test_an_update_on_stacked_batches_equals_one_on_concatenated_ones():
    batches = [_trajectories(0, 1), _trajectories(1, 2, P=3)]
    merged, cond = merge(batches)
    assert isinstance(merged.states, RowStack) and isinstance(merged.next_samples, RowStack)
    everything = torch.arange(len(merged))
    concatenated = Transitions(
        **{
            **vars(merged),
            "states": merged.states[torch.arange(len(merged.states))],
            "next_samples": merged.next_samples[everything],
        }
    )
    cfg = load_config(None, ["rewards=[{name: r}]"])
    adv = torch.cat([plan_advantages(b.plan, b.leaf_rewards, cfg).reshape(-1) for b in batches])
    spec = StepSpec(grid=sampling_grid(T), eta=0.7, sde_type="flow")
    base = ElementwiseVelocity((4, 3))
    outcomes = []
    for transitions in (merged, concatenated):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        stats = grpo_update(
            model, list(model.parameters()), opt, transitions, adv, cond, spec,
            clip_range=0.2, max_grad_norm=1.0, step_mode="per_sde_step", max_batch=3,
        )  # fmt: skip
        outcomes.append((stats.as_dict(), [p.detach().clone() for p in model.parameters()]))
    assert outcomes[0][0] == outcomes[1][0]
    stacked, concatenated = outcomes[0][1], outcomes[1][1]
    assert all(torch.equal(a, b) for a, b in zip(stacked, concatenated, strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(stacked, base.parameters(), strict=True))


@ray.remote(num_cpus=0)
class _Rank:
    """Holds what it was sent, as a learner rank holds its batches during an update."""

    def private_mib(self) -> float:
        return psutil.Process().memory_full_info().uss / 2**20

    def take(self, batch) -> float:
        self.held = batch  # keep it alive while measuring
        first = batch.transitions.states if isinstance(batch, Trajectories) else batch
        assert float(first.flatten()[0]) == 1.0
        return self.private_mib()


def test_a_rank_holds_no_private_copy_of_a_received_batch(ray_local):
    mib = 256
    states = torch.ones(mib * 2**20 // 4 // 64, 64)  # 256 MiB of fp32 states
    batch = _trajectories(0, 1)
    batch.transitions.states = states
    rank = _Rank.remote()
    before = ray.get(rank.private_mib.remote())
    shared = ray.get(rank.take.remote(ray.put(batch))) - before
    # the control: a bare tensor is unpickled into the rank's own memory
    control = _Rank.remote()
    before = ray.get(control.private_mib.remote())
    private = ray.get(control.take.remote(ray.put(states))) - before
    ray.kill(rank)
    ray.kill(control)
    assert private > 0.8 * mib, private
    assert shared < 0.1 * mib, shared
