"""The tiny world end to end: pretrain --quick as a real process, load the result
through diffusers' FluxPipeline and our loaders, roll out, decode, evaluate."""

import json
import os
import subprocess

import numpy as np
import pytest
import torch
from g2rpo.common.algorithms.schedules import sampling_grid
from g2rpo.common.families.flux_pipeline import FluxComponents, load_prompt_embeddings
from g2rpo.common.families.loaders import ModelPathError
from g2rpo.rollout_worker.engine import RolloutEngine, draw_noise
from g2rpo.rollout_worker.plan import g2rpo_plan
from test_cli import G2RPO

PROMPTS = ["a red circle on a blue background", "a white cross on a black background"]


def _run(*args, timeout=600):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run(
        [G2RPO, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


@pytest.mark.slow  # g2rpo pretrain --quick: about 15 s
def test_quick_world_layout_and_metadata(quick_world):
    pipe = quick_world / "pipeline"
    for sub in (
        "transformer",
        "vae",
        "text_encoder",
        "text_encoder_2",
        "tokenizer",
        "tokenizer_2",
        "scheduler",
    ):
        assert (pipe / sub).is_dir(), sub
    assert (pipe / "model_index.json").is_file()
    assert (quick_world / "shapes_clip" / "config.json").is_file()
    meta = json.loads((quick_world / "world.json").read_text())
    assert meta["quick"] and meta["seed"] == 0 and "pretrain" in meta["command"]
    assert len(meta["split"]["held_out"]) == 40
    again = _run("pretrain", "--quick", "--out", str(quick_world))
    assert again.returncode == 2 and "already exists" in again.stderr


def test_diffusers_flux_pipeline_loads_and_generates_offline(quick_world):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(quick_world / "pipeline", local_files_only=True)
    out = pipe(
        PROMPTS[0],
        height=32,
        width=32,
        num_inference_steps=4,
        max_sequence_length=16,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
    ).images
    assert out.shape == (1, 32, 32, 3) and np.isfinite(out).all()


def test_our_encoder_matches_flux_pipeline(quick_world):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(quick_world / "pipeline", local_files_only=True)
    seq, pooled, _ = pipe.encode_prompt(PROMPTS, prompt_2=None, max_sequence_length=16)
    comps = FluxComponents.load(quick_world / "pipeline")
    with torch.no_grad():
        ours = comps.encode_prompts(PROMPTS, 16)
    assert torch.allclose(ours["encoder_hidden_states"], seq, atol=1e-6)
    assert torch.allclose(ours["pooled_projections"], pooled, atol=1e-6)


def test_g2rpo_rollout_on_the_loaded_pipeline_decodes_images(quick_world):
    comps = FluxComponents.load(quick_world / "pipeline")
    with torch.no_grad():
        cond = comps.encode_prompts(PROMPTS, 16)
    plan = g2rpo_plan(2, 6, 3, [0, 1], [1, 2])
    h, w = comps.latent_size(32, 32)
    init, sde = draw_noise(plan, ((h // 2) * (w // 2), 64), torch.Generator().manual_seed(0))
    engine = RolloutEngine(comps.velocity_model(32, 32), sampling_grid(6), max_batch=16)
    result = engine.run(plan, cond, init, sde)
    images = comps.decode(result.leaf_latents, 32, 32, batch=7)
    assert images.dtype == torch.uint8 and images.shape == (len(plan.leaves), 32, 32, 3)
    assert len(result.transitions) == 2 * 2 * 3
    with pytest.raises(ValueError, match="multiples of 8"):
        comps.latent_size(30, 32)


def test_eval_world_reports_and_draws_a_grid(quick_world, tmp_path):
    grid = tmp_path / "grid.png"
    res = _run(
        "eval",
        "world",
        "--world",
        str(quick_world),
        "--samples-per-prompt",
        "1",
        "--grid",
        str(grid),
        "--json",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads(res.stdout)
    for split in ("held_out", "train"):
        assert report[split]["samples"] == 40
        assert 0.0 <= report[split]["checker"]["pass"] <= 1.0
    assert 0.0 <= report["shapes_clip_auc"] <= 1.0
    from PIL import Image

    assert Image.open(grid).size[0] > 200


def test_embed_prompts_cache_round_trip(quick_world, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n\n")
    cache = tmp_path / "embeds.safetensors"
    res = _run(
        "embed-prompts",
        "--pipeline",
        str(quick_world / "pipeline"),
        "--prompts",
        str(prompts),
        "--out",
        str(cache),
        "--max-sequence-length",
        "16",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    names, tensors = load_prompt_embeddings(cache)
    assert names == PROMPTS
    comps = FluxComponents.load(quick_world / "pipeline")
    with torch.no_grad():
        direct = comps.encode_prompts(PROMPTS, 16)
    for key, value in direct.items():
        assert torch.allclose(tensors[key], value, atol=1e-6)


def test_loaders_refuse_hubs_and_missing_components(tmp_path):
    with pytest.raises(ModelPathError, match="hub id"):
        FluxComponents.load("black-forest-labs/FLUX.1-dev")
    (tmp_path / "model_index.json").write_text("{}")
    with pytest.raises(ModelPathError, match="'transformer'"):
        FluxComponents.load(tmp_path)
    res = _run(
        "embed-prompts",
        "--pipeline",
        "black-forest-labs/FLUX.1-dev",
        "--prompts",
        __file__,
        "--out",
        str(tmp_path / "x.safetensors"),
    )
    assert res.returncode == 2 and "hub id" in res.stderr and "Traceback" not in res.stderr


def test_random_tiny_flux_pipeline_with_guidance_through_the_loader(tmp_path):
    """A random FLUX.1-dev-shaped pipeline (guidance embedding on) saved in the real layout."""
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        FluxPipeline,
        FluxTransformer2DModel,
    )
    from g2rpo.world.flow import TRANSFORMER_CONFIG
    from g2rpo.world.text import build_clip_tokenizer, build_t5_tokenizer, build_text_encoders
    from g2rpo.world.vae import VAE_CONFIG

    tok, tok2 = build_clip_tokenizer(), build_t5_tokenizer()
    clip, t5 = build_text_encoders(len(tok), len(tok2))
    FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=AutoencoderKL(**VAE_CONFIG),
        text_encoder=clip,
        tokenizer=tok,
        text_encoder_2=t5,
        tokenizer_2=tok2,
        transformer=FluxTransformer2DModel(**{**TRANSFORMER_CONFIG, "guidance_embeds": True}),
    ).save_pretrained(tmp_path)
    comps = FluxComponents.load(tmp_path)
    assert comps.transformer.config.guidance_embeds
    with torch.no_grad():
        cond = comps.encode_prompts(PROMPTS, 16)
        v = comps.velocity_model(32, 32, guidance=3.5)(
            torch.randn(2, 16, 64), torch.tensor([1.0, 0.5]), cond
        )
        images = comps.decode(torch.randn(2, 16, 64), 32, 32)
    assert v.shape == (2, 16, 64) and images.shape == (2, 32, 32, 3)


def test_committed_default_world_loads_and_its_reward_separates_pairs():
    from g2rpo.common.paths import DEFAULT_WORLD
    from g2rpo.common.prompts.shapes import render_batch, split_combinations
    from g2rpo.reward_server.scorers.registry import make_scorer
    from g2rpo.world.evaluate import auc, sample_images

    comps = FluxComponents.load(DEFAULT_WORLD / "pipeline")
    images = sample_images(comps, PROMPTS, seed=0)
    assert images.shape == (2, 32, 32, 3) and images.dtype == np.uint8
    _, held = split_combinations(0, 40)
    clip = make_scorer("shapes_clip")
    truth = render_batch(held, seed=5)
    wrong = [held[(i + 7) % len(held)].prompt for i in range(len(held))]
    assert auc(clip.score(truth, [s.prompt for s in held]), clip.score(truth, wrong)) > 0.9


def test_the_clip_tokenizer_is_the_same_in_every_process_and_keeps_words_whole():
    # tokenizers' BpeTrainer had numbered its end-of-word tokens in hash-map order, so
    # two runs of `g2rpo pretrain --seed 0` trained different worlds
    import sys

    from g2rpo.common.prompts.shapes import all_combinations
    from g2rpo.world.text import WORDS, build_clip_tokenizer

    probe = (
        "from g2rpo.world.text import build_clip_tokenizer as b; "
        "print(b().backend_tokenizer.to_str())"
    )
    runs = [
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    assert runs[0].stdout == runs[1].stdout
    tok = build_clip_tokenizer()
    assert json.loads(runs[0].stdout)["model"]["vocab"] == tok.get_vocab()
    unknown = tok.convert_tokens_to_ids(tok.unk_token)
    for word in WORDS:
        assert tok.tokenize(word) == [word + "</w>"]
    for spec in all_combinations():
        ids = tok(spec.prompt).input_ids[1:-1]
        assert len(ids) == len(spec.prompt.split()) and unknown not in ids
