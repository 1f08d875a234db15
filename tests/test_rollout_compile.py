"""model.compile: a rollout transformer with its repeated blocks compiled (torch.compile
through inductor's C++ backend on CPU) samples what the eager one samples, within the
engine's parity tolerance; a published version loaded into it and the colocated
offload's move (swap_tensors) neither recompile nor break it; the rollout worker builds
it so and the learner never; CUDA graphs are refused off CUDA. Every test here fails at
3bb9114, which has no model.compile (nor ``for_rollout``).

Time: a random FLUX-layout transformer (1 double + 1 single block, 32 wide) compiled
once for the module: about 30 CPU-s with an empty inductor cache, under 10 with a warm
one; the rest about 5 s (two worlds loaded: no compile)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import flux_cond
from g2rpo.common.errors import ConfigError
from small_run import ONE_WORKER

REPO = Path(__file__).resolve().parents[1]
SMALL = ONE_WORKER
TOL = 1e-4  # test_engine's batched-vs-reference parity on a FLUX transformer


def _cfg(*extra: str):
    from g2rpo.common.config.loading import load_config

    return load_config(REPO / "configs" / "tiny.yaml", [*SMALL, *extra])


@pytest.fixture(scope="module")
def pair():
    """(eager, compiled) velocity adapters over two copies of one random FLUX-layout
    transformer, as a rollout worker holds it (eval, no grad)."""
    from g2rpo.common.families.flux import FluxVelocity, build_tiny_flux

    eager, compiled = (
        FluxVelocity(build_tiny_flux("test", seed=0).requires_grad_(False), 4, 4) for _ in range(2)
    )
    return eager, compiled.for_rollout("blocks")


def _rollout(velocity, iteration: int = 0):
    """A G2RPO tree of 2 prompts (every call a batch of 2 or more), 6 steps, G=3."""
    from g2rpo.common.algorithms.schedules import sampling_grid
    from g2rpo.rollout_worker.engine import RolloutEngine, draw_noise
    from g2rpo.rollout_worker.plan import g2rpo_plan

    plan = g2rpo_plan(2, 6, 3, [0, 2], [1, 2])
    init, sde = draw_noise(plan, (4, 64), torch.Generator().manual_seed(iteration))
    return RolloutEngine(velocity, sampling_grid(6, 3.0)).run(plan, flux_cond(2), init, sde)


def _assert_parity(compiled, eager) -> None:
    assert compiled.nfe == eager.nfe and compiled.model_calls == eager.model_calls
    assert (compiled.leaf_latents - eager.leaf_latents).abs().max() <= TOL
    lp_c, lp_e = compiled.transitions.old_log_probs, eager.transitions.old_log_probs
    assert lp_c.shape == lp_e.shape and (lp_c - lp_e).abs().max() <= TOL
    # the SDE samples the learner replays (a log-prob alone is the noise's, whatever v)
    sample_c, sample_e = compiled.transitions.next_samples, eager.transitions.next_samples
    assert (sample_c - sample_e).abs().max() <= TOL


def _warm(compiled) -> None:
    """The compiled adapter has compiled its blocks (a test run alone needs this)."""
    from g2rpo.common.families.transformer_compile import graphs_compiled

    if graphs_compiled() == 0:
        _rollout(compiled)


def test_compiled_rollout_equals_eager(pair):
    """Catches: no model.compile; a compiled rollout drifting from the eager one; a
    recompile per batch size of the wavefront (one graph per block class serves all)."""
    from g2rpo.common.families.transformer_compile import compiled_blocks, graphs_compiled

    eager, compiled = pair
    assert compiled_blocks(compiled.transformer) == 2 and compiled.compile == "blocks"
    assert compiled_blocks(eager.transformer) == 0
    before = graphs_compiled()
    got = _rollout(compiled)
    assert graphs_compiled() - before in (0, 2)  # 0: another test compiled them first
    assert got.model_calls > 2  # a tree of several batch sizes, not one batch
    _assert_parity(got, _rollout(eager))
    before = graphs_compiled()
    with torch._dynamo.config.patch(error_on_recompile=True):
        again = _rollout(compiled, iteration=1)  # the next iteration's tree
    assert graphs_compiled() == before
    _assert_parity(again, _rollout(eager, iteration=1))


def test_published_version_does_not_recompile(pair):
    """Catches: a load that replaces parameters (or their dtype, or requires_grad) and
    makes every new version recompile the blocks; a compiled rollout still sampling the
    old weights."""
    from g2rpo.common.families.transformer_compile import graphs_compiled
    from g2rpo.common.wire.weights import load_published, weights_checksum

    eager, compiled = pair
    _warm(compiled)
    old = _rollout(compiled).leaf_latents
    gen = torch.Generator().manual_seed(7)
    state = {
        k: v + 0.05 * torch.randn(v.shape, generator=gen)
        for k, v in eager.transformer.state_dict().items()
    }
    for velocity in pair:  # as RolloutWorkerCore.load_weights loads a version
        load_published(velocity.transformer, 1, state, weights_checksum(state), lora=False)
    before = graphs_compiled()
    with torch._dynamo.config.patch(error_on_recompile=True):
        got = _rollout(compiled)
    assert graphs_compiled() == before
    assert (got.leaf_latents - old).abs().max() > 1e-3  # the new version is what sampled
    _assert_parity(got, _rollout(eager))


def _swap_to_fresh_storage(module: torch.nn.Module) -> None:
    """A device round trip as the colocated offload makes it, on CPU: every parameter's
    data moved into new storage by torch's swap_tensors conversion (what
    time_sharing.move_module uses, keeping each Parameter object)."""
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        module._apply(lambda t: t.clone())
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)


def test_offload_round_trip_keeps_the_compiled_blocks(pair):
    """Catches: torch keeping weakrefs to the parameters after a compile, which makes
    swap_tensors (the offload's move) raise "Couldn't swap" (pytorch#186796); a moved
    parameter recompiling the blocks or leaving them on stale storage."""
    from g2rpo.common.families.transformer_compile import graphs_compiled

    eager, compiled = pair
    _warm(compiled)
    transformer = compiled.transformer
    params = list(transformer.parameters())
    storage = [p.data_ptr() for p in params]
    _swap_to_fresh_storage(transformer)
    assert all(a is b for a, b in zip(params, transformer.parameters(), strict=True))
    assert all(p.data_ptr() != s for p, s in zip(params, storage, strict=True))
    with torch.no_grad():
        for p in params:
            p.mul_(1.01)  # the blocks read the new storage, not the old
        eager.transformer.load_state_dict(transformer.state_dict())
    before = graphs_compiled()
    with torch._dynamo.config.patch(error_on_recompile=True):
        got = _rollout(compiled)
    assert graphs_compiled() == before
    _assert_parity(got, _rollout(eager))


def test_flop_counter_sees_the_compiled_transformer_eagerly(pair):
    """Catches: a compiled call under torch's FLOP counter (the doctor's FLOPs per NFE)
    raising "fullgraph=True found no compiled frames", or counting other FLOPs."""
    from g2rpo.common.algorithms.flops import count_flops
    from g2rpo.common.families.transformer_compile import graphs_compiled

    eager, compiled = pair
    _warm(compiled)
    x, t, cond = torch.randn(1, 4, 64), torch.tensor([0.5]), flux_cond(1)
    before = graphs_compiled()
    with torch.inference_mode():
        flops = count_flops(lambda: compiled(x, t, cond))
        assert flops == count_flops(lambda: eager(x, t, cond)) > 0
    assert graphs_compiled() == before
    with torch._dynamo.config.patch(error_on_recompile=True):
        _rollout(compiled)  # still compiled: the counter left no skip behind


def test_worker_compiles_its_transformer_as_configured():
    """Catches: model.compile not reaching the rollout worker's transformer (the world's
    2 double + 4 single blocks; compiled lazily, so nothing is traced here)."""
    from g2rpo.common.families.transformer_compile import compiled_blocks
    from g2rpo.rollout_worker.worker import RolloutWorkerCore

    worker = RolloutWorkerCore(_cfg("model.compile=blocks"), 0)
    assert compiled_blocks(worker.comps.transformer) == 6
    assert worker.model.compile == "blocks"
    assert compiled_blocks(RolloutWorkerCore(_cfg(), 0).comps.transformer) == 0


def test_learner_is_never_compiled():
    """Catches: model.compile reaching the learner's transformer (the issue asks for the
    rollout; a compiled update would need its own parity)."""
    from g2rpo.common.families.transformer_compile import compiled_blocks
    from g2rpo.learner.trainer import LearnerCore

    learner = LearnerCore(_cfg("model.compile=blocks"))
    assert compiled_blocks(learner.transformer) == 0


def test_cuda_graphs_are_refused_off_cuda_and_on_a_colocated_worker():
    """Catches: CUDA graphs (torch.compile reduce-overhead) silently asked for on a CPU,
    or on a colocated worker, where their memory pool would stay on the GPU through the
    learner's turn."""
    from g2rpo.common.families.flux import build_tiny_flux
    from g2rpo.common.families.transformer_compile import (
        check_placement,
        compile_blocks,
        compiled_blocks,
    )

    with pytest.raises(ConfigError, match=r"blocks_cuda_graphs with train\.placement colocated"):
        check_placement("blocks_cuda_graphs", "colocated")
    check_placement("blocks", "colocated")
    check_placement("blocks_cuda_graphs", "disaggregated")

    with pytest.raises(ValueError, match=r"model\.compile blocks_cuda_graphs.*model\.device"):
        _cfg("model.compile=blocks_cuda_graphs")
    model = build_tiny_flux("test")
    with pytest.raises(ConfigError, match=r"model\.compile blocks_cuda_graphs.*cpu"):
        compile_blocks(model, "blocks_cuda_graphs")
    assert compiled_blocks(model) == 0


def test_blocks_are_found_for_every_family():
    """Catches: SD3's transformer (diffusers declares no _repeated_blocks for it) refused
    or compiled whole; FLUX not taking diffusers' own selection."""
    from diffusers import SD3Transformer2DModel
    from g2rpo.common.families.flux import build_tiny_flux
    from g2rpo.common.families.transformer_compile import compile_blocks, repeated_block_classes

    flux = build_tiny_flux("test")
    assert repeated_block_classes(flux) == ["FluxTransformerBlock", "FluxSingleTransformerBlock"]
    assert compile_blocks(flux, "blocks") == 2  # compiled lazily: nothing traced yet
    sd3 = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=3,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=16,
        caption_projection_dim=16,
        pooled_projection_dim=16,
        out_channels=4,
    )
    assert repeated_block_classes(sd3) == ["JointTransformerBlock"]
    assert compile_blocks(sd3, "blocks") == 3
    assert compile_blocks(build_tiny_flux("test"), "none") == 0


def test_bench_engine_times_the_compiled_engine_against_the_eager_one():
    """Catches: `g2rpo bench engine --compile` timing another model than the eager run's,
    recompiling after its first run, or drifting from the eager leaves."""
    from g2rpo.benchmarks.rollout import bench_engine

    result = bench_engine(
        size="test",
        latent_size=4,
        num_steps=4,
        group_size=2,
        sde_steps=[0],
        granularities=[1],
        num_prompts=2,  # batches of 2 and 4: the shapes the module's tests compiled
        text_tokens=5,
        compile="blocks",
        engine_only=True,
    )
    c = result["compiled"]
    assert c["compile"] == "blocks" and c["recompiled_after_first_run"] == 0
    assert c["parity_latent_max_abs"] <= TOL and c["parity_log_prob_max_abs"] <= TOL
    assert c["first_run_equals_steady"]
    assert c["speedup_vs_eager"] == pytest.approx(
        result["engine"]["wall_s"] / c["wall_s"], rel=0.05
    )
    assert result["raw_forward"] is None and result["nfe_batched"] == result["nfe_expected"]
