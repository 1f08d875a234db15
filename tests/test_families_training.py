"""The other model families through `g2rpo train`: three iterations of the small setting
on a random pipeline in StableDiffusion3Pipeline's layout and one in QwenImagePipeline's
(classifier-free guidance in every model call; Qwen-Image's rescaled true CFG on its
own resolution-shifted σ grid), on the session's local Ray with its warm actors."""

from __future__ import annotations

import pytest
import torch
from g2rpo.orchestration.driver import read_metrics
from small_run import small_train

pytestmark = pytest.mark.slow


def test_sd3_trains_three_iterations(warm, world, scorer_url, tmp_path):
    from diffusers import SD3Transformer2DModel
    from g2rpo.world.sd3_random import build_random_sd3_pipeline

    sd3 = build_random_sd3_pipeline(tmp_path / "sd3", seed=3)
    extra = [f"model.pretrained={sd3}", "model.guidance=4.5"]
    run = small_train(world, tmp_path, "sd3", 3, extra, reward_url=scorer_url, warm=warm)
    rows = read_metrics(run)
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["transitions"] == 2 * 1 * 2 * 4  # workers · prompts · K · G
        assert "eval/shapes_clip" in r and r["optimizer_steps"] == 2
    # the learner's log-probs are the worker's: both see the guided velocity v_u + s(v_c − v_u)
    assert abs(rows[0]["ratio_min"] - 1) < 1e-4 and abs(rows[0]["ratio_max"] - 1) < 1e-4
    final = SD3Transformer2DModel.from_pretrained(run / "final" / "transformer")
    base = SD3Transformer2DModel.from_pretrained(sd3 / "transformer")
    moved = [
        not torch.equal(a, b)
        for a, b in zip(final.state_dict().values(), base.state_dict().values(), strict=True)
    ]
    assert any(moved)  # it trained, and the export is SD3's layout


def test_qwen_image_trains_three_iterations(warm, world, scorer_url, tmp_path):
    from diffusers import QwenImageTransformer2DModel
    from g2rpo.world.qwenimage_random import build_random_qwenimage_pipeline

    qwen = build_random_qwenimage_pipeline(tmp_path / "qwen", seed=3)
    extra = [
        f"model.pretrained={qwen}",
        "model.guidance=4.0",
        "model.quantize_timestep=false",
        "sampling.sigma_grid=diffusers",
        "sampling.sde_steps=[0]",  # one group, one optimizer step: every ratio before it
    ]
    run = small_train(world, tmp_path, "qwen", 3, extra, reward_url=scorer_url, warm=warm)
    rows = read_metrics(run)
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["transitions"] == 2 * 1 * 1 * 4
        assert "eval/shapes_clip" in r and r["optimizer_steps"] == 1
    # the learner sees the worker's rescaled guided velocity on the worker's σ grid:
    # ratios of exactly 1 before the step (a learner without the guidance: 7.8e-4 away)
    assert abs(rows[0]["ratio_min"] - 1) < 1e-5 and abs(rows[0]["ratio_max"] - 1) < 1e-5
    final = QwenImageTransformer2DModel.from_pretrained(run / "final" / "transformer")
    base = QwenImageTransformer2DModel.from_pretrained(qwen / "transformer")
    moved = [
        not torch.equal(a, b)
        for a, b in zip(final.state_dict().values(), base.state_dict().values(), strict=True)
    ]
    assert any(moved)
