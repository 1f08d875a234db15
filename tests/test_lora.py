"""The learner and the rollout workers agree on the policy: LoRA runs publish,
checkpoint and export adapters only and workers load them strictly; the KL reference
is the base model; the compute dtype reaches both sides; the update counts the
transitions that all-equal groups leave without an advantage."""

import dataclasses

import pytest
import torch
from g2rpo.common.config.loading import load_config
from g2rpo.common.wire.trajectories import Trajectories
from g2rpo.common.wire.weights import WeightMismatch
from g2rpo.learner.trainer import LearnerCore
from g2rpo.rollout_worker.plan import anchor_plan, plan_for
from g2rpo.rollout_worker.worker import RolloutWorkerCore
from small_run import SMALL_RUN

PROMPTS = ["a red circle on a white background", "a blue square on a black background"]
# these tests sample PROMPTS themselves: as many prompts per worker (SMALL_RUN has one)
SMALL = [
    *SMALL_RUN,
    f"sampling.prompts_per_worker={len(PROMPTS)}",
    "train.workers.count=1",
    "optim.lr=1e-3",
]
LORA = ["model.lora.rank=4", "model.lora.alpha=8"]


def _cfg(world, *extra):
    return load_config(None, [*SMALL, f"model.pretrained={world / 'pipeline'}", *extra])


def _velocity_out(model, seed=0):
    c = model.transformer.config
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 16, c.in_channels, generator=g)
    cond = {
        "encoder_hidden_states": torch.randn(2, 16, c.joint_attention_dim, generator=g),
        "pooled_projections": torch.randn(2, c.pooled_projection_dim, generator=g),
    }
    with torch.no_grad():
        return model(x, torch.tensor([0.9, 0.4]), cond)


def _synthetic_trajectories(worker: RolloutWorkerCore, iteration: int, version: int):
    """A real rollout on the worker's pipeline, with seeded stand-in rewards (these
    tests are about weights and KL, not about the reward service)."""
    gen = torch.Generator().manual_seed(iteration)
    plan = plan_for(worker.cfg, iteration, gen)
    cond, result, _ = worker._sample(plan, PROMPTS, gen)
    rewards = torch.rand(len(plan.leaves), generator=torch.Generator().manual_seed(7 + iteration))
    return Trajectories(
        worker=0,
        iteration=iteration,
        version=version,
        prompts=PROMPTS,
        plan=plan,
        transitions=result.transitions,
        cond=cond,
        leaf_rewards={"shapes_clip": rewards},
        nfe=result.nfe,
        model_calls=result.model_calls,
    )


def test_adapters_only_are_published_and_workers_match_the_learner(world, tmp_path):
    full = LearnerCore(_cfg(world))
    cfg = _cfg(world, *LORA)
    learner, worker = LearnerCore(cfg), RolloutWorkerCore(cfg, 0)
    _, full_state, _ = full.weights()
    version, state, checksum = learner.weights()
    assert state and all(".lora_A." in k or ".lora_B." in k for k in state)
    lora_numel = sum(t.numel() for t in state.values())
    assert lora_numel < 0.2 * sum(t.numel() for t in full_state.values())
    # B starts at zero: the adapted model is the base model, exactly
    base = _velocity_out(full.velocity)
    assert torch.equal(_velocity_out(learner.velocity), base)

    # one real update on a real rollout moves the adapters and only them
    assert worker.load_weights(version, state, checksum).holds(version, checksum)
    stats = learner.update([_synthetic_trajectories(worker, 0, version)])
    assert stats["ratio_min"] > 0.9 and stats["optimizer_steps"] == 2
    version, state, checksum = learner.weights()
    assert version == 1
    base_after = {k: v for k, v in learner.transformer.state_dict().items() if "lora_" not in k}
    for k, v in base_after.items():  # the frozen base did not move
        assert torch.equal(v, full_state[k.replace(".base_layer", "")]), k
    worker.load_weights(version, state, checksum)
    moved = _velocity_out(learner.velocity)
    assert not torch.allclose(moved, base)
    assert torch.equal(_velocity_out(worker.model), moved)

    # a state that does not fit the adapters is refused, naming what is wrong
    bad = dict(state)
    bad.pop(next(iter(bad)))
    from g2rpo.common.wire.weights import weights_checksum

    with pytest.raises(WeightMismatch, match="missing"):
        worker.load_weights(version, bad, weights_checksum(bad))


def test_lora_checkpoint_and_export_load_back(world, tmp_path):
    from diffusers import FluxPipeline
    from g2rpo.common.families.flux import FluxVelocity

    cfg = _cfg(world, *LORA)
    learner, worker = LearnerCore(cfg), RolloutWorkerCore(cfg, 0)
    learner.update([_synthetic_trajectories(worker, 0, 0)])
    ckpt = learner.state_dict()
    assert "lora" in ckpt and "transformer" not in ckpt
    torch.save(ckpt, tmp_path / "ckpt.pt")
    again = LearnerCore(cfg)
    again.load_state_dict(torch.load(tmp_path / "ckpt.pt", weights_only=False))
    assert again.weights()[2] == learner.weights()[2] and again.iteration == 1
    # a full-weight checkpoint is not silently loaded into a LoRA run
    with pytest.raises(ValueError, match=r"model\.lora"):
        again.load_state_dict(LearnerCore(_cfg(world)).state_dict())

    # the export is what diffusers' own LoRA loader reads
    path = learner.export(str(tmp_path / "final"))
    assert path.endswith("pytorch_lora_weights.safetensors")
    pipe = FluxPipeline.from_pretrained(world / "pipeline", local_files_only=True)
    side = 8  # 32-px images, VAE factor 4
    before = _velocity_out(FluxVelocity(pipe.transformer, side, side))
    pipe.load_lora_weights(tmp_path / "final")
    after = _velocity_out(FluxVelocity(pipe.transformer, side, side))
    learner.transformer.eval()
    expected = _velocity_out(learner.velocity)
    assert not torch.allclose(before, expected)
    torch.testing.assert_close(after, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lora", [True, False])
def test_flowgrpo_kl_is_zero_at_the_reference_and_grows(world, lora):
    extra = [
        "algorithm.name=flowgrpo",
        "algorithm.flowgrpo.kl_beta=0.5",
        "sampling.sde_steps=[0]",
        "optim.step_mode=accumulate",
        *(LORA if lora else []),
    ]
    cfg = _cfg(world, *extra)
    learner, worker = LearnerCore(cfg), RolloutWorkerCore(cfg, 0)
    first = learner.update([_synthetic_trajectories(worker, 0, 0)])
    assert first["kl"] == 0.0  # one optimizer step, taken after the loss: policy == reference
    version, state, checksum = learner.weights()
    worker.load_weights(version, state, checksum)
    second = learner.update([_synthetic_trajectories(worker, 1, version)])
    assert second["kl"] > 0.0


def test_lora_target_modules_that_match_nothing_name_the_field(world):
    with pytest.raises(ValueError, match=r"model\.lora\.target_modules"):
        LearnerCore(_cfg(world, "model.lora.target_modules=[no_such_layer]"))


def test_anchor_plan_is_unchanged_by_lora_at_init(world):
    """Evaluation samples of a fresh LoRA run equal the base model's."""
    prompts = PROMPTS
    base, lora = (RolloutWorkerCore(_cfg(world, *extra), 0) for extra in ([], LORA))
    outs = []
    for w in (base, lora):
        _, _, images = w._sample(anchor_plan(2, 6), prompts, torch.Generator().manual_seed(3))
        outs.append(images)
    assert torch.equal(outs[0], outs[1])


def test_adapter_init_depends_on_the_run_seed_only(world):
    torch.manual_seed(123)  # the global RNG must not matter
    a = LearnerCore(_cfg(world, *LORA)).weights()[2]
    torch.rand(5)
    b = LearnerCore(_cfg(world, *LORA)).weights()[2]
    c = LearnerCore(_cfg(world, *LORA, "run.seed=1")).weights()[2]
    assert a == b != c


def test_compute_dtype_reaches_rollout_and_learner_alike(world):
    """model.dtype=bfloat16: both sides compute under bf16 autocast over fp32 weights."""
    cfg = _cfg(world, "model.dtype=bfloat16")
    learner, worker = LearnerCore(cfg), RolloutWorkerCore(cfg, 0)
    fp32 = _velocity_out(RolloutWorkerCore(_cfg(world), 0).model)
    on_learner, on_worker = _velocity_out(learner.velocity), _velocity_out(worker.model)
    assert torch.equal(on_learner, on_worker)
    err = float((on_learner - fp32).abs().max())
    assert 0 < err < 0.05 * float(fp32.abs().max())  # bf16 rounding, not another model
    stats = learner.update([_synthetic_trajectories(worker, 0, 0)])
    assert abs(stats["ratio_mean"] - 1) < 1e-2, stats


def test_lora_on_a_bf16_base_trains_fp32_adapters(world):
    cfg = _cfg(world, *LORA, "model.dtype=bfloat16")
    learner, worker = LearnerCore(cfg), RolloutWorkerCore(cfg, 0)
    for model in (learner.transformer, worker.comps.transformer):
        dtypes = {("lora_" in n, p.dtype) for n, p in model.named_parameters()}
        assert dtypes == {(False, torch.bfloat16), (True, torch.float32)}
    assert worker.comps.text_encoder_2.dtype == torch.bfloat16
    learner.update([_synthetic_trajectories(worker, 0, 0)])
    version, state, checksum = learner.weights()
    assert all(t.dtype == torch.float32 for t in state.values())
    worker.load_weights(version, state, checksum)
    assert torch.equal(_velocity_out(worker.model), _velocity_out(learner.velocity))


def test_float16_training_is_refused_naming_the_field(world):
    with pytest.raises(ValueError, match=r"model\.dtype float16"):
        LearnerCore(_cfg(world, "model.dtype=float16"))


def test_adv_zero_frac_counts_the_transitions_of_all_equal_groups(world):
    """A 0/1 reward leaves whole groups equal: their advantages are exactly zero and
    train nothing. Prompt 0's leaves all score 1; prompt 1's score by the parity of
    their place j in the group (the same at both granularities, so no branch's summed
    advantage cancels), so exactly half of the transitions (prompt 0's) carry none."""
    cfg = _cfg(world)
    learner, worker = LearnerCore(cfg), RolloutWorkerCore(cfg, 0)
    batch = _synthetic_trajectories(worker, 0, 0)
    rewards = torch.tensor(
        [1.0 if leaf.prompt == 0 else float(leaf.coords[-1] % 2) for leaf in batch.plan.leaves]
    )
    batch = dataclasses.replace(batch, leaf_rewards={"shapes_clip": rewards})
    stats = learner.update([batch])
    assert stats["adv_zero_frac"] == 0.5
