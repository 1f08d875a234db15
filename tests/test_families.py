"""Model families: a directory loads by its pipeline class, and each family's
deterministic sampler (our engine on an anchor plan) draws the images diffusers' own
pipeline draws from the same noise and σ grid: SD3 on a random pipeline in
StableDiffusion3Pipeline's layout, FLUX on the committed world."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from g2rpo.common.algorithms.schedules import sampling_grid
from g2rpo.common.families.registry import family_of, load_components
from g2rpo.common.paths import DEFAULT_WORLD
from g2rpo.rollout_worker.engine import RolloutEngine, draw_noise
from g2rpo.rollout_worker.plan import anchor_plan

PROMPTS = ["a red circle on a blue background", "a green square on a white background"]
STEPS, SHIFT, SIZE, TOKENS = 6, 3.0, 32, 16


@pytest.fixture(scope="module")
def sd3_dir(tmp_path_factory):
    from g2rpo.world.sd3_random import build_random_sd3_pipeline

    return build_random_sd3_pipeline(tmp_path_factory.mktemp("sd3") / "pipeline", seed=3)


def ours(comps, guidance: float, grid: str = "uniform"):
    """Our anchor samples (float64 σ grid, unquantised timesteps) and their noise."""
    plan = anchor_plan(len(PROMPTS), STEPS)
    init, sde = draw_noise(plan, comps.packed_shape(SIZE, SIZE), torch.Generator().manual_seed(7))
    model = comps.velocity_model(SIZE, SIZE, guidance=guidance)
    engine = RolloutEngine(model, sampling_grid(STEPS, SHIFT, False, grid), max_batch=8)
    with torch.no_grad():
        result = engine.run(plan, comps.encode_prompts(PROMPTS, TOKENS), init, sde)
    return comps.decode(result.leaf_latents, SIZE, SIZE), init


def unshifted_sigmas() -> list[float]:
    # the pipeline's scheduler shifts the σ it is given and appends 0: ours unshifted
    return np.linspace(1.0, 0.0, STEPS + 1)[:-1].tolist()


def as_uint8(images: torch.Tensor) -> torch.Tensor:
    return (images.permute(0, 2, 3, 1).float() * 255).round().to(torch.int16)


def test_a_directory_names_its_family(sd3_dir, tmp_path):
    assert family_of(DEFAULT_WORLD / "pipeline") == "flux"
    assert family_of(sd3_dir) == "sd3"
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    with pytest.raises(ValueError, match="'WanPipeline' is not a family"):
        family_of(tmp_path)


def test_sd3_prompts_encode_as_stable_diffusion_3_pipeline(sd3_dir):
    from diffusers import StableDiffusion3Pipeline

    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_dir, local_files_only=True)
    seq, neg, pooled, neg_pooled = pipe.encode_prompt(
        PROMPTS, None, None, do_classifier_free_guidance=True, max_sequence_length=TOKENS
    )
    with torch.no_grad():
        cond = load_components(sd3_dir).encode_prompts(PROMPTS, TOKENS)
    for key, theirs in (
        ("encoder_hidden_states", seq),
        ("pooled_projections", pooled),
        ("negative_encoder_hidden_states", neg),
        ("negative_pooled_projections", neg_pooled),
    ):
        assert cond[key].shape == theirs.shape, key
        assert torch.allclose(cond[key], theirs, atol=1e-6), key


@pytest.mark.parametrize("guidance", [4.5, 1.0])
def test_sd3_sampler_draws_stable_diffusion_3_pipelines_images(sd3_dir, guidance):
    from diffusers import StableDiffusion3Pipeline

    mine, init = ours(load_components(sd3_dir), guidance)
    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_dir, local_files_only=True)
    theirs = pipe(
        PROMPTS,
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        sigmas=unshifted_sigmas(),
        guidance_scale=guidance,
        latents=init,
        max_sequence_length=TOKENS,
        output_type="pt",
    ).images
    diff = (mine.to(torch.int16) - as_uint8(theirs)).abs()
    assert int(diff.max()) <= 1, f"{int(diff.max())}/255 apart"  # float64 vs float32 σ
    assert mine.float().std() > 1  # images, not a constant


def test_sd3_sampler_on_the_diffusers_grid_draws_the_pipelines_default_images(sd3_dir):
    # sampling.sigma_grid: diffusers: the scheduler's own σ (no sigmas= passed), as
    # Flow-GRPO's SD3 code samples
    from diffusers import StableDiffusion3Pipeline

    mine, init = ours(load_components(sd3_dir), 4.5, "diffusers")
    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_dir, local_files_only=True)
    theirs = pipe(
        PROMPTS,
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        guidance_scale=4.5,
        latents=init,
        max_sequence_length=TOKENS,
        output_type="pt",
    ).images
    diff = (mine.to(torch.int16) - as_uint8(theirs)).abs()
    assert int(diff.max()) <= 1, f"{int(diff.max())}/255 apart"
    uniform, _ = ours(load_components(sd3_dir), 4.5)
    assert (uniform.to(torch.int16) - as_uint8(theirs)).abs().max() > 1  # the grids differ


def test_flux_sampler_draws_flux_pipelines_images():
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    world = DEFAULT_WORLD / "pipeline"
    mine, init = ours(load_components(world), 3.5)
    pipe = FluxPipeline.from_pretrained(world, local_files_only=True)
    # our recipes' static shift; the world's scheduler config may shift by resolution
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=SHIFT, use_dynamic_shifting=False)
    h = w = SIZE // pipe.vae_scale_factor
    packed = init.view(len(PROMPTS), h // 2, w // 2, -1, 2, 2)  # our tokens are its packing
    theirs = pipe(
        PROMPTS,
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        sigmas=unshifted_sigmas(),
        guidance_scale=3.5,
        latents=packed.reshape(len(PROMPTS), -1, init.shape[-1]),
        max_sequence_length=TOKENS,
        output_type="pt",
    ).images
    diff = (mine.to(torch.int16) - as_uint8(theirs)).abs()
    assert int(diff.max()) <= 1, f"{int(diff.max())}/255 apart"


def test_sd3_random_weights_preset_saves_a_pipeline_diffusers_loads(sd3_dir, tmp_path):
    # `g2rpo doctor --random-weights sd35-medium --blocks L,0`: the preset's components
    # (tested at full size in test_plan.py), here the test pipeline's configs in their
    # place so it builds in a moment, with SD3.5's dual-attention layers 0-1
    from g2rpo.planning import random_pipeline as rp

    assert set(rp.architecture_configs("sd35-medium")) == {
        "transformer",
        "vae",
        "text_encoder",
        "text_encoder_2",
        "text_encoder_3",
    }
    small = {
        c: json.loads((sd3_dir / c / "config.json").read_text())
        for c in rp.FAMILY_COMPONENTS["sd3"]
    }
    small["transformer"]["dual_attention_layers"] = [0, 1]
    original = rp.architecture_configs
    rp.architecture_configs = lambda name: small
    try:
        path = rp.build_random_pipeline(tmp_path / "p", "sd35-medium", blocks=(1, 0))
        with pytest.raises(Exception, match="LAYERS,0 for SD3"):
            rp.build_random_pipeline(tmp_path / "q", "sd35-medium", blocks=(1, 2))
    finally:
        rp.architecture_configs = original
    assert family_of(path) == "sd3"
    comps = load_components(path)
    assert comps.transformer.config.num_layers == 1
    assert comps.transformer.config.dual_attention_layers == [0]  # the kept layer's
    assert comps.packed_shape(32, 32) == (16, 8, 8)
    with torch.no_grad():
        cond = comps.encode_prompts(PROMPTS, TOKENS)
    assert cond["encoder_hidden_states"].shape[0] == len(PROMPTS)


def test_the_sd3_rehearsal_model_keeps_the_recipes_data_sizes(tmp_path):
    # `g2rpo rehearse configs/*_sd35.yaml`: SD3.5-Medium's latent geometry and text
    # sequence (77 CLIP rows + the recipe's T5 tokens), shrunk in width and depth
    from g2rpo.common.config.loading import load_config
    from g2rpo.orchestration.rehearsal_setup import rehearsal_pipeline
    from g2rpo.planning.estimate import architecture

    recipe = Path(__file__).resolve().parents[1] / "configs" / "flowgrpo_sd35.yaml"
    archs, where = architecture(load_config(recipe))
    assert where.startswith("preset sd35-medium")
    comps = load_components(rehearsal_pipeline(tmp_path / "p", archs, blocks=1))
    assert comps.packed_shape(512, 512) == (16, 64, 64)  # as SD3.5-Medium's at 512²
    assert comps.transformer.config.pos_embed_max_size == 384
    with torch.no_grad():
        cond = comps.encode_prompts(PROMPTS, 128)
    assert cond["encoder_hidden_states"].shape[:2] == (2, 77 + 128)
    assert cond["negative_encoder_hidden_states"].shape[:2] == (2, 77 + 128)


def test_sd3_rollout_worker_plan_holds_its_traced_sample(sd3_dir):
    # the plan's SD3 terms (three text encoders, the unpacked latent, the guided call on
    # two rows, CLIP's rows before T5's) against torch's MemTracker on the real worker core
    from g2rpo.common.config.loading import load_config
    from g2rpo.planning.estimate import plan
    from g2rpo.rollout_worker.worker import RolloutWorkerCore
    from test_plan import SMALL, _actor, _traced_peak

    over = [*SMALL, f"model.pretrained={sd3_dir}", "model.guidance=4.5"]
    cfg = load_config(None, [*over, "sampling.max_batch=16", "sampling.decode_batch=16"])
    core = RolloutWorkerCore(cfg, 0)
    c = core.comps
    encoders = (c.text_encoder, c.text_encoder_2, c.text_encoder_3)
    with torch.no_grad():
        traced = _traced_peak(
            lambda: core.sample(0, PROMPTS), c.transformer, c.vae, *encoders, grads=False
        )
    estimate = _actor(plan(cfg), "rollout worker").peak
    assert estimate == pytest.approx(traced, rel=0.10)


@pytest.mark.parametrize("family", ["sd3", "qwenimage"])
def test_a_family_world_trains_and_evaluates(family, tmp_path):
    # `g2rpo pretrain --family F --quick`: the layout and the code path (SD3 on the
    # committed world's VAE, Qwen-Image on its own 3-D VAE with per-channel latent
    # statistics; the transformer and encoders trained through the family's own
    # encoding), then the world's own evaluation on it
    from g2rpo.world.evaluate import evaluate_world
    from g2rpo.world.family_world import pretrain_family

    meta = pretrain_family(tmp_path / "w", family, quick=True, progress=False)
    assert meta["family"] == family and meta["quick"] and meta["flow_loss_ema"] > 0
    world = tmp_path / "w"
    assert family_of(world / "pipeline") == family
    vae = world / "pipeline" / "vae" / "diffusion_pytorch_model.safetensors"
    committed = DEFAULT_WORLD / "pipeline" / "vae" / "diffusion_pytorch_model.safetensors"
    if family == "sd3":  # the same latents as the FLUX world's
        assert vae.read_bytes() == committed.read_bytes()
    else:
        config = json.loads((world / "pipeline" / "vae" / "config.json").read_text())
        assert len(config["latents_mean"]) == len(config["latents_std"]) == 16
        from diffusers import AutoencoderKLQwenImage

        default = AutoencoderKLQwenImage.from_config({}).config.latents_std
        assert config["latents_std"] != list(default)  # measured here, not Qwen-Image's
        assert load_components(world / "pipeline").packed_shape(32, 32) == (16, 64)
    report = evaluate_world(world, samples_per_prompt=1)
    assert report["held_out"]["samples"] == len(meta["split"]["held_out"])
    assert 0 <= report["held_out"]["checker"]["pass"] <= 1
    assert report["shapes_clip_auc"] > 0.9  # the copied reward still separates pairs
    with pytest.raises(Exception, match="already exists"):
        pretrain_family(world, family, quick=True, progress=False)


@pytest.mark.parametrize("family", ["sd3", "qwenimage"])
def test_a_committed_family_world_draws_the_prompts_colours(family):
    # assets/shapes-world-<family> (READMEs there: every held-out colour right)
    from g2rpo.common.prompts.shapes import split_combinations
    from g2rpo.reward_server.scorers.shapes_oracle import ShapesOracle
    from g2rpo.world.evaluate import sample_images

    world = DEFAULT_WORLD.parent / f"shapes-world-{family}"
    meta = json.loads((world / "world.json").read_text())
    assert meta["family"] == family and not meta["quick"]
    comps = load_components(world / "pipeline")
    prompts = [s.prompt for s in split_combinations()[1][:8]]  # held out
    checks = ShapesOracle().checks(sample_images(comps, prompts, seed=0), prompts)
    assert all(c.bg_ok and c.fg_ok for c in checks)


def test_a_qwen_image_world_is_sampled_on_its_pipelines_own_grid():
    from g2rpo.common.algorithms.schedules import sampling_grid
    from g2rpo.world.evaluate import world_grid

    qwen = load_components(DEFAULT_WORLD.parent / "shapes-world-qwenimage" / "pipeline")
    grid = world_grid(qwen, 16, 3.0, 32)
    assert torch.equal(grid.sigmas, qwen.sigmas(16, 32, 32))  # shift 3 plays no part
    assert torch.equal(grid.timesteps, grid.sigmas.float())
    sd3 = load_components(DEFAULT_WORLD.parent / "shapes-world-sd3" / "pipeline")
    diffusers = sampling_grid(16, 3.0, False, "diffusers")
    assert torch.equal(world_grid(sd3, 16, 3.0, 32).sigmas, diffusers.sigmas)


def test_a_bare_sd3_pipeline_is_evaluated_as_stable_diffusion_3_pipeline_samples(tmp_path):
    """Issue 58: `g2rpo eval` of a bare SD3 pipeline had sampled on the uniform σ grid,
    up to 14/255 from StableDiffusion3Pipeline's images on the committed SD3 world. Its
    scheduler's own grid and shift now, as the pipeline: to 1/255 from the same noise;
    a scheduler saved with another shift is followed."""
    import shutil

    from diffusers import StableDiffusion3Pipeline
    from g2rpo.evaluation.evaluate import pipeline_settings, sample_fixed_noise

    world = DEFAULT_WORLD.parent / "shapes-world-sd3" / "pipeline"
    for shift in (3.0, 1.5):
        pipeline = world
        if shift != 3.0:  # the world with its scheduler saved at another shift
            pipeline = tmp_path / "pipeline"
            shutil.copytree(world, pipeline)
            config = json.loads((pipeline / "scheduler" / "scheduler_config.json").read_text())
            config["shift"] = shift
            (pipeline / "scheduler" / "scheduler_config.json").write_text(json.dumps(config))
        settings = pipeline_settings(
            pipeline, num_steps=STEPS, image_size=SIZE, max_sequence_length=TOKENS
        )
        assert settings.shift == shift
        comps = load_components(pipeline)
        mine = sample_fixed_noise(comps, PROMPTS, 11, settings)
        shape = comps.packed_shape(SIZE, SIZE)
        init = torch.randn((len(PROMPTS), *shape), generator=torch.Generator().manual_seed(11))
        pipe = StableDiffusion3Pipeline.from_pretrained(pipeline, local_files_only=True)
        theirs = pipe(
            PROMPTS,
            height=SIZE,
            width=SIZE,
            num_inference_steps=STEPS,
            guidance_scale=settings.guidance,
            latents=init,
            max_sequence_length=TOKENS,
            output_type="pt",
        ).images
        diff = np.abs(mine.astype(np.int16) - as_uint8(theirs).numpy())
        assert int(diff.max()) <= 1, f"shift {shift}: {int(diff.max())}/255 apart"
        assert mine.std() > 1


def test_a_bare_pipeline_is_evaluated_as_its_family_samples():
    # `g2rpo eval PIPELINE_DIR` has no run config: the family's guidance, σ grid and
    # timestep convention (FLUX's 3.5 had been every family's)
    from g2rpo.evaluation.evaluate import pipeline_settings

    assets = DEFAULT_WORLD.parent
    qwen = pipeline_settings(assets / "shapes-world-qwenimage" / "pipeline", num_steps=8)
    assert (qwen.guidance, qwen.sigma_grid, qwen.quantize_timestep) == (4.0, "diffusers", False)
    assert qwen.num_steps == 8
    sd3 = pipeline_settings(assets / "shapes-world-sd3" / "pipeline", guidance=2.0)
    assert (sd3.guidance, sd3.sigma_grid, sd3.quantize_timestep) == (2.0, "diffusers", False)
    assert sd3.shift == 3.0  # its scheduler's
    flux = pipeline_settings(DEFAULT_WORLD / "pipeline", guidance=None)
    assert (flux.guidance, flux.sigma_grid, flux.quantize_timestep) == (3.5, "uniform", True)
