"""The Qwen-Image family: a random pipeline in QwenImagePipeline's layout loads by its
class, encodes prompts as the pipeline does (chat template, system turn dropped, mask),
and our deterministic sampler on the pipeline's own σ grid (shifted by the image's
token count, stretched to 0.02) draws the pipeline's images from the same noise, with
true CFG and its norm rescale and without guidance."""

from __future__ import annotations

import pytest
import torch
from g2rpo.common.families.qwenimage_pipeline import NEGATIVE_PROMPT, guided_velocity, trim_padding
from g2rpo.common.families.registry import family_of, load_components, pipeline_sampling_grid
from g2rpo.rollout_worker.engine import RolloutEngine, draw_noise
from g2rpo.rollout_worker.plan import anchor_plan

PROMPTS = ["a red circle on a blue background", "a green square"]
STEPS, SIZE, TOKENS = 6, 32, 16


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    from g2rpo.world.qwenimage_random import build_random_qwenimage_pipeline

    return build_random_qwenimage_pipeline(tmp_path_factory.mktemp("qwen") / "pipeline", seed=3)


@pytest.fixture(scope="module")
def pipe(qwen_dir):
    from diffusers import QwenImagePipeline

    return QwenImagePipeline.from_pretrained(qwen_dir, local_files_only=True)


def ours(qwen_dir, guidance: float, grid: str = "diffusers"):
    comps = load_components(qwen_dir)
    plan = anchor_plan(len(PROMPTS), STEPS)
    init, sde = draw_noise(plan, comps.packed_shape(SIZE, SIZE), torch.Generator().manual_seed(7))
    model = comps.velocity_model(SIZE, SIZE, guidance=guidance)
    sigma_grid = pipeline_sampling_grid(qwen_dir, STEPS, 3.0, False, grid, SIZE)
    engine = RolloutEngine(model, sigma_grid, max_batch=8)
    with torch.no_grad():
        result = engine.run(plan, comps.encode_prompts(PROMPTS, TOKENS), init, sde)
    return comps.decode(result.leaf_latents, SIZE, SIZE), init


def as_uint8(images: torch.Tensor) -> torch.Tensor:
    return (images.permute(0, 2, 3, 1).float() * 255).round().to(torch.int16)


def test_a_qwen_image_directory_names_its_family(qwen_dir):
    assert family_of(qwen_dir) == "qwenimage"
    comps = load_components(qwen_dir)
    assert comps.packed_shape(SIZE, SIZE) == (4, 64)  # 8x compression, 2x2 tokens of 16 channels
    with pytest.raises(ValueError, match="multiples of 16"):
        comps.latent_size(40, 32)


def test_qwen_image_prompts_encode_as_the_pipeline(qwen_dir, pipe):
    with torch.no_grad():
        cond = load_components(qwen_dir).encode_prompts(PROMPTS, TOKENS)
    for prefix, prompts in (("", PROMPTS), ("negative_", [NEGATIVE_PROMPT] * 2)):
        theirs, their_mask = pipe.encode_prompt(prompts, max_sequence_length=TOKENS)
        mine = cond[prefix + "encoder_hidden_states"]
        mask = cond[prefix + "encoder_hidden_states_mask"]
        assert mine.shape[1] == TOKENS  # padded to the run's length: prompts batch together
        text, trimmed = trim_padding(mine, mask)
        assert text.shape == theirs.shape, prefix
        assert torch.allclose(text, theirs, atol=1e-6), prefix
        if their_mask is None:  # every row full: neither passes a mask
            assert trimmed is None
        else:
            assert torch.equal(trimmed.bool(), their_mask.bool())
    assert cond["encoder_hidden_states_mask"].sum(1).tolist() == [12, 8]  # words + 5 chat tokens


def test_true_cfg_rescales_each_token_to_the_conditional_norm():
    positive, negative = torch.randn(2, 3, 5, 64).unbind(0)
    v = guided_velocity(positive, negative, 4.0)
    assert torch.allclose(v.norm(dim=-1), positive.norm(dim=-1), atol=1e-5)
    direction = negative + 4.0 * (positive - negative)
    cos = torch.nn.functional.cosine_similarity(v, direction, dim=-1)
    assert torch.allclose(cos, torch.ones_like(cos), atol=1e-5)


@pytest.mark.parametrize("guidance", [4.0, 1.0])
def test_qwen_image_sampler_draws_the_pipelines_images(qwen_dir, pipe, guidance):
    mine, init = ours(qwen_dir, guidance)
    theirs = pipe(
        PROMPTS,
        negative_prompt=[NEGATIVE_PROMPT] * 2 if guidance > 1 else None,
        true_cfg_scale=guidance,
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        latents=init,  # our tokens are its packing
        max_sequence_length=TOKENS,
        output_type="pt",
    ).images
    diff = (mine.to(torch.int16) - as_uint8(theirs)).abs()
    assert int(diff.max()) <= 1, f"{int(diff.max())}/255 apart"  # float64 vs float32 σ
    assert mine.float().std() > 1  # images, not a constant
    if guidance > 1:  # guidance changes the images: the negative rows took part
        unguided, _ = ours(qwen_dir, 1.0)
        assert (unguided.to(torch.int16) - mine.to(torch.int16)).abs().max() > 1


def test_the_qwen_image_grid_is_its_schedulers_at_the_images_size(qwen_dir):
    grid = pipeline_sampling_grid(qwen_dir, STEPS, 3.0, False, "diffusers", SIZE)
    assert grid.sigmas[0] == 1.0 and grid.sigmas[-1] == 0.0
    assert float(grid.sigmas[-2]) == pytest.approx(0.02)  # shift_terminal
    larger = pipeline_sampling_grid(qwen_dir, STEPS, 3.0, False, "diffusers", 1024)
    assert (larger.sigmas[1:-2] > grid.sigmas[1:-2]).all()  # more tokens, more shift
    uniform = pipeline_sampling_grid(qwen_dir, STEPS, 3.0, False, "uniform", SIZE)
    assert float(uniform.sigmas[-2]) != pytest.approx(0.02)


def test_qwen_image_random_weights_preset_saves_a_pipeline_diffusers_loads(qwen_dir, tmp_path):
    # `g2rpo doctor --random-weights qwen-image --blocks L,0`: the preset's components
    # (Qwen-Image's 20.4B transformer, 8.3B Qwen2.5-VL), here the test pipeline's configs
    # in their place so it builds in a moment
    import json

    from g2rpo.planning import random_pipeline as rp
    from g2rpo.planning.estimate import parameter_counts
    from g2rpo.planning.presets import preset_config

    assert set(rp.architecture_configs("qwen-image")) == {"transformer", "vae", "text_encoder"}
    billions = {
        c: parameter_counts(c, preset_config("qwen-image", c))["total"] / 1e9
        for c in ("transformer", "text_encoder")
    }
    assert billions["transformer"] == pytest.approx(20.43, abs=0.01)
    assert billions["text_encoder"] == pytest.approx(8.29, abs=0.01)
    small = {
        c: json.loads((qwen_dir / c / "config.json").read_text())
        for c in rp.FAMILY_COMPONENTS["qwenimage"]
    }
    original = rp.architecture_configs
    rp.architecture_configs = lambda name: small
    try:
        path = rp.build_random_pipeline(tmp_path / "p", "qwen-image", blocks=(1, 0))
        with pytest.raises(Exception, match="LAYERS,0 for SD3 and Qwen-Image"):
            rp.build_random_pipeline(tmp_path / "q", "qwen-image", blocks=(1, 2))
    finally:
        rp.architecture_configs = original
    assert family_of(path) == "qwenimage"
    comps = load_components(path)
    assert comps.transformer.config.num_layers == 1
    with torch.no_grad():
        cond = comps.encode_prompts(PROMPTS, TOKENS)
    assert cond["encoder_hidden_states"].shape == (2, TOKENS, 64)


def test_the_qwen_image_rehearsal_model_keeps_the_recipes_data_sizes(tmp_path):
    # `g2rpo rehearse` of a Qwen-Image recipe: Qwen-Image's latent geometry (8x VAE, 2x2
    # tokens of 16 channels) and text sequence, shrunk in width and depth
    from g2rpo.orchestration.rehearsal_setup import rehearsal_pipeline
    from g2rpo.planning.presets import preset_config

    archs = {c: preset_config("qwen-image", c) for c in ("transformer", "vae", "text_encoder")}
    comps = load_components(rehearsal_pipeline(tmp_path / "p", archs, blocks=1))
    assert comps.packed_shape(512, 512) == (1024, 64)  # as Qwen-Image's at 512²
    with torch.no_grad():
        cond = comps.encode_prompts(PROMPTS, 128)
        images = comps.decode(torch.randn(1, 1024, 64), 512, 512)
    assert cond["encoder_hidden_states"].shape[:2] == (2, 128)
    assert cond["negative_encoder_hidden_states"].shape[:2] == (2, 128)
    assert images.shape == (1, 512, 512, 3)


def test_qwen_image_rollout_worker_plan_holds_its_traced_sample(qwen_dir):
    # the plan's Qwen-Image terms (one Qwen2.5-VL encoder, packed latents, the guided call
    # on two rows, a 3-D VAE's decode) against torch's MemTracker on the real worker core
    from g2rpo.common.config.loading import load_config
    from g2rpo.planning.estimate import plan
    from g2rpo.rollout_worker.worker import RolloutWorkerCore
    from test_plan import SMALL, _actor, _traced_peak

    over = [*SMALL, f"model.pretrained={qwen_dir}", "model.guidance=4.0"]
    cfg = load_config(None, [*over, "sampling.max_batch=16", "sampling.decode_batch=16"])
    core = RolloutWorkerCore(cfg, 0)
    c = core.comps
    with torch.no_grad():
        traced = _traced_peak(
            lambda: core.sample(0, PROMPTS), c.transformer, c.vae, c.text_encoder, grads=False
        )
    estimate = _actor(plan(cfg), "rollout worker").peak
    assert estimate == pytest.approx(traced, rel=0.10)
