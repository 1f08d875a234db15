"""The one-gather replay (learner/replay.py): under optim.step_mode accumulate every
trained SDE step of a micro-batch goes through the model in one forward (each row with
its own timestep and σ), split only where train.learner.max_batch caps a forward; it
gives the per-step replay's loss and gradient (to float32 rounding) and a ratio of 1
before any update; per_sde_step runs the forwards it ran before. Each test fails on
3bb9114, which had neither the per-step replay to compare against nor the forward-call
count (``learner_calls``), and whose ratio check stacked every step whatever the step
mode."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import ElementwiseVelocity, toy_cond
from g2rpo.common.algorithms.schedules import sampling_grid
from g2rpo.common.config.loading import load_config
from g2rpo.learner.advantages import plan_advantages
from g2rpo.learner.grpo import StepSpec, grpo_update
from g2rpo.rollout_worker.engine import RolloutEngine, draw_noise
from g2rpo.rollout_worker.plan import g2rpo_plan

REPO = Path(__file__).resolve().parents[1]
SHAPE = (4, 3)
T = 8


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps the gradient it was handed at every step."""

    def __init__(self, params, lr=0.0):
        super().__init__(params, lr=lr)
        self.seen = []

    def step(self, closure=None):
        self.seen.append([p.grad.detach().clone() for p in self.param_groups[0]["params"]])
        return super().step(closure)


class BatchRecorder(ElementwiseVelocity):
    """The elementwise velocity (each sample's output is bit-identical in any batch),
    recording the states and timesteps of every forward."""

    def __init__(self, shape):
        super().__init__(shape)
        self.batches: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, x, timestep, cond):
        self.batches.append((x.detach().clone(), timestep.detach().clone()))
        return super().forward(x, timestep, cond)


def _toy_update(model, ks=(0, 2, 5), prompts=2, **kw):
    """One G²RPO rollout of ``model`` and its update (lr 0: the weights stay)."""
    plan = g2rpo_plan(prompts, T, 4, list(ks), [1, 2])
    init, sde = draw_noise(plan, SHAPE, torch.Generator().manual_seed(0))
    cond = toy_cond(prompts)
    with torch.no_grad():
        result = RolloutEngine(model, sampling_grid(T)).run(plan, cond, init, sde)
    leaf_r = torch.rand(len(plan.leaves), generator=torch.Generator().manual_seed(3))
    adv = plan_advantages(plan, {"r": leaf_r}, load_config(None, ["rewards=[{name: r}]"]))
    model.calls = 0
    if isinstance(model, BatchRecorder):
        model.batches.clear()
    opt = RecordingSGD(model.parameters())
    kw = {"clip_range": 1e-4, "max_grad_norm": 1e9, "step_mode": "accumulate", **kw}
    spec = StepSpec(grid=sampling_grid(T), eta=0.7, sde_type="flow")
    stats = grpo_update(
        model, list(model.parameters()), opt, result.transitions, adv, cond, spec, **kw
    )
    return stats, opt.seen, result.transitions


def test_accumulate_replays_every_sde_step_in_one_forward_with_the_per_step_loss_and_gradient():
    """Catches a stacked replay whose loss or gradient departs from replaying each SDE
    step apart (a row given another row's timestep, σ or weight), or that runs more
    forwards than one."""
    model = ElementwiseVelocity(SHAPE)
    per, per_grads, tr = _toy_update(model, replay="per_step")
    per_calls = model.calls
    one, one_grads, _ = _toy_update(model)
    assert (model.calls, one.learner_calls) == (1, 1)  # 6 states of 3 SDE steps, stacked
    assert (per_calls, per.learner_calls) == (3, 3)  # one forward per SDE step
    assert one.nfe_learn == per.nfe_learn == tr.states.shape[0] == 6
    assert one.optimizer_steps == per.optimizer_steps == 1
    # the rows are the same numbers (an elementwise model), only summed in another order
    assert one.loss == pytest.approx(per.loss, abs=1e-7)
    for a, b in zip(one_grads[0], per_grads[0], strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-9)
        assert float(a.abs().max()) > 1e-4  # a gradient that could differ
    # the ratio before any update, in the stacked forward: exactly 1
    assert one.ratio_min == one.ratio_max == 1.0 and one.clip_fraction == 0.0


@pytest.mark.parametrize("max_batch", [1, 4, 5, 12, 64])
def test_stacked_forwards_hold_at_most_max_batch_states_in_the_fewest_forwards(max_batch):
    """Catches a stacked forward past train.learner.max_batch (the activations the plan
    bounds) or more forwards than ceil(states / max_batch)."""
    model = BatchRecorder(SHAPE)
    stats, grads, tr = _toy_update(model, ks=(0, 1, 2, 3), prompts=3, max_batch=max_batch)
    states = tr.states.shape[0]
    assert states == 12
    assert stats.learner_calls == len(model.batches) == math.ceil(states / max_batch)
    assert all(x.shape[0] <= max_batch for x, _ in model.batches)
    assert sum(x.shape[0] for x, _ in model.batches) == states  # each state once
    # every row at its own timestep: the forwards' timesteps are the states' steps
    steps = torch.cat([t for _, t in model.batches])
    expected = sampling_grid(T).timesteps[tr.state_step]
    assert torch.equal(steps, expected.to(steps.dtype))
    whole, whole_grads, _ = _toy_update(ElementwiseVelocity(SHAPE), ks=(0, 1, 2, 3), prompts=3)
    assert stats.loss == pytest.approx(whole.loss, abs=1e-7)
    for a, b in zip(grads[0], whole_grads[0], strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-9)


def test_per_sde_step_runs_one_sde_steps_states_per_forward_as_before():
    """per_sde_step stays as it was: each forward holds one SDE step's states, in step
    order, and the stacked and per-step replays are the same forwards, bit for bit."""
    model = BatchRecorder(SHAPE)
    stacked, stacked_grads, tr = _toy_update(model, step_mode="per_sde_step")
    forwards = list(model.batches)
    per, per_grads, _ = _toy_update(model, step_mode="per_sde_step", replay="per_step")
    assert stacked.optimizer_steps == 3 and stacked.learner_calls == per.learner_calls == 3
    for i, (x, t) in enumerate(forwards):
        step = torch.unique(tr.state_step)[i]
        assert torch.equal(x, tr.states[tr.state_step == step])
        assert bool((t == sampling_grid(T).timesteps[step]).all())
    for (x, t), (y, u) in zip(forwards, model.batches, strict=True):
        assert torch.equal(x, y) and torch.equal(t, u)
    assert stacked.loss == per.loss
    for a, b in zip(stacked_grads, per_grads, strict=True):
        assert all(torch.equal(g, h) for g, h in zip(a, b, strict=True))


def _bench_replay(*args: str):
    """``g2rpo bench replay`` as a real process."""
    import shutil
    import subprocess
    import sys

    exe = shutil.which("g2rpo") or str(Path(sys.executable).parent / "g2rpo")
    return subprocess.run(
        [exe, "bench", "replay", *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_sharded_group_gathers_once_per_forward_and_agrees_with_the_per_step_replay():
    """`g2rpo bench replay`: two gloo ranks of one FSDP2 group (the learner's sharded
    path). Per rank, the stacked replay runs one forward where the per-step replay runs
    one per SDE step, and FSDP2 gathers per forward (2·blocks + 1 all-gathers, blocks +
    1 reduce-scatters), not per SDE step; the first updates agree in loss and gradient
    to float32 rounding and the ratio before any update is 1. Catches a replay that
    gathers per SDE step."""
    out = _bench_replay(
        "--size", "test", "--prompts", "2", "--sde-steps", "0", "2", "4", "--repeats", "1", "--json"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout)
    units, blocks = r["settings"]["fsdp_units"], r["settings"]["blocks"]
    assert (units, blocks) == (3, 2) and r["settings"]["states"] == 6
    for rank in r["per_rank"].values():
        per, one = rank["per_step"], rank["stacked"]
        assert per["learner_calls"] == per["forward_calls_seen"] == 3  # 3 states a rank
        assert one["learner_calls"] == one["forward_calls_seen"] == 1
        for p in (per, one):
            assert p["all_gathers"] == p["learner_calls"] * (2 * blocks + 1)
            assert p["reduce_scatters"] == p["learner_calls"] * units
            assert p["optimizer_steps"] == 1 and p["ratio_max_abs_dev"] < 1e-6
    assert r["loss_abs_diff"] < 1e-6
    assert r["grad_max_abs"] > 1e-6
    assert r["grad_max_abs_diff"] < 1e-5 * r["grad_max_abs"]  # measured 4e-7 of it
    bad = _bench_replay("--max-batch", "0")
    assert bad.returncode == 2 and "--max-batch" in bad.stderr


# --- the committed world, through the learner's objective ---------------------------

WORLD = [
    f"model.pretrained={REPO / 'assets' / 'shapes-world' / 'pipeline'}",
    "sampling.num_steps=6",
    "sampling.prompts_per_worker=2",
    "train.workers.count=1",
    "optim.step_mode=accumulate",
    "optim.max_grad_norm=1e9",  # the gradients compared as computed
]
PROMPTS = ["a red circle on a blue background", "a green square on a yellow background"]
METHODS = {
    "g2rpo": ["sampling.sde_steps=[0,2,3]", "sampling.group_size=3"],
    "g2rpo-split": [  # 6 states in forwards of 4 and 2
        "sampling.sde_steps=[0,2,3]",
        "sampling.group_size=3",
        "train.learner.max_batch=4",
    ],
    "dancegrpo": ["algorithm.name=dancegrpo", "sampling.group_size=2"],
    "flowgrpo-kl": [
        "algorithm.name=flowgrpo",
        "sampling.group_size=2",
        "algorithm.flowgrpo.kl_beta=0.04",
    ],
    "mixgrpo": [
        "algorithm.name=mixgrpo",
        "algorithm.mixgrpo.window_size=2",
        "sampling.group_size=2",
    ],
    "flowgrpo_fast": [
        "algorithm.name=flowgrpo_fast",
        "algorithm.flowgrpo_fast.branch_max=2",
        "sampling.group_size=2",
    ],
    "tempflow": [
        "algorithm.name=tempflow",
        "sampling.granularities=[1]",
        "sampling.sde_steps=[0,1,2]",
        "sampling.group_size=2",
    ],
    "branchgrpo": [
        "algorithm.name=branchgrpo",
        "algorithm.branchgrpo.split_steps=[0,2]",
        "algorithm.branchgrpo.width_pruning=branch_best",
        "sampling.group_size=4",
        "sampling.eta=0.3",
    ],
    "treegrpo": [
        "algorithm.name=treegrpo",
        "algorithm.treegrpo.depth=2",
        "sampling.group_size=4",
    ],
    "grpo_guard": [
        "sampling.sde_steps=[0,2,3]",
        "sampling.group_size=3",
        "optim.loss=grpo_guard",
        "optim.clip_range=4e-6",
    ],
    "cps": [
        "algorithm.name=flowgrpo",
        "sampling.sde_type=cps",
        "sampling.eta=0.8",
        "optim.cps_ratio=flow_grpo",
        "optim.clip_range=1e-5",
        "sampling.group_size=2",
    ],
}


def _world_batch(cfg):
    from g2rpo.rollout_worker.worker import RolloutWorkerCore

    worker = RolloutWorkerCore(cfg, 0)
    plan, cond, result, _ = worker.sample(0, PROMPTS)
    rewards = {
        "shapes_clip": torch.rand(len(plan.leaves), generator=torch.Generator().manual_seed(5))
    }
    return worker.trajectories(0, PROMPTS, plan, cond, result, rewards)


def _calls(module: torch.nn.Module) -> list[int]:
    count = [0]
    module.register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    return count


@pytest.mark.parametrize("method", list(METHODS))
def test_every_accumulate_method_stacks_its_steps_and_keeps_the_per_step_update(method):
    """Each log-prob method that can run with step_mode accumulate (every one:
    common/config/algorithm.py refuses none), through PolicyGradient as training calls
    it: the stacked replay runs ceil(states / max_batch) policy forwards (and as many of
    the KL reference's), the per-step replay one or more per SDE step; both give the same
    loss and gradient, and the ratio before any update is 1."""
    from g2rpo.learner.objective import LearnerParts
    from g2rpo.learner.policy_gradient import PolicyGradient
    from g2rpo.learner.trainer import LearnerCore

    cfg = load_config(REPO / "configs" / "tiny.yaml", [*WORLD, *METHODS[method]])
    batch = _world_batch(cfg)
    core = LearnerCore(cfg)
    policy = _calls(core.transformer)
    reference = _calls(core.reference.transformer) if core.reference is not None else None
    assert (reference is not None) == (method == "flowgrpo-kl")
    adv = plan_advantages(batch.plan, {"shapes_clip": batch.leaf_rewards["shapes_clip"]}, cfg)
    tr = batch.transitions
    found = {}
    for replay in ("per_step", "stacked"):
        policy[0] = 0
        if reference is not None:
            reference[0] = 0
        opt = RecordingSGD(core.trainable)
        parts = LearnerParts(
            cfg=cfg,
            velocity=core.velocity,
            trainable=core.trainable,
            optimizer=opt,
            spec=core.spec,
            reference=core.reference,
            kl_beta=core.kl_beta,
            share=core.share,
            iteration=0,
        )
        stats = PolicyGradient(replay).update(parts, [batch], adv, 0)
        assert stats["learner_calls"] == policy[0] and stats["optimizer_steps"] == 1
        if reference is not None:
            assert reference[0] == policy[0] and stats["nfe_learn_no_grad"] > 0
        found[replay] = stats, opt.seen[0]
    (per, per_grads), (one, one_grads) = found["per_step"], found["stacked"]
    # the states the update replays (BranchGRPO's width pruning keeps some rows only)
    states = one["nfe_learn"] - one["nfe_learn_no_grad"]
    assert one["learner_calls"] == math.ceil(states / cfg.train.learner.max_batch)
    if method != "branchgrpo":  # (its width pruning trains some of the rows only)
        assert per["learner_calls"] == len(torch.unique(tr.state_step))  # within max_batch
    assert per["learner_calls"] > one["learner_calls"]
    assert per["nfe_learn"] == one["nfe_learn"]
    assert one["loss"] == pytest.approx(per["loss"], abs=1e-6)
    assert one["kl"] == pytest.approx(per["kl"], abs=1e-9)
    scale = max(float(g.abs().max()) for g in per_grads)
    assert scale > 0
    # float32 rounding of another batch composition: measured ≤ 9e-7 of the largest
    # gradient entry over these methods
    for a, b in zip(one_grads, per_grads, strict=True):
        assert float((a - b).abs().max()) <= 1e-5 * scale
    for s in (one, per):
        assert abs(s["ratio_min"] - 1) < 1e-5 and abs(s["ratio_max"] - 1) < 1e-5


@pytest.mark.parametrize("step_mode", ["per_sde_step", "accumulate"])
def test_ratio_check_runs_the_forwards_the_update_runs(step_mode):
    """`g2rpo doctor`'s precision check replays as training does: per SDE step under
    per_sde_step (3bb9114 stacked every step there, a batch composition training never
    runs), one forward under accumulate; its ratio is 1 before any update."""
    from g2rpo.learner.ratio_check import ratio_before_update
    from g2rpo.learner.trainer import LearnerCore

    cfg = load_config(
        REPO / "configs" / "tiny.yaml",
        [*WORLD, *METHODS["g2rpo"], f"optim.step_mode={step_mode}"],
    )
    batch = _world_batch(cfg)
    core = LearnerCore(cfg)
    calls = _calls(core.transformer)
    ratios = ratio_before_update(core, batch.transitions, batch.cond)
    checked = calls[0]
    calls[0] = 0
    stats = core.update([batch])
    assert checked == calls[0] == (3 if step_mode == "per_sde_step" else 1)
    assert stats["learner_calls"] == calls[0]
    assert ratios.shape == (len(batch.transitions),)
    assert float((ratios - 1).abs().max()) < 1e-5
