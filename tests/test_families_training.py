"""The other model families through `g2rpo train`: three iterations of the small setting
on the committed worlds in StableDiffusion3Pipeline's layout and in QwenImagePipeline's
(classifier-free guidance in every model call; Qwen-Image's rescaled true CFG on its
own resolution-shifted σ grid), on the session's local Ray with its warm actors."""

from __future__ import annotations

import pytest
import torch
from g2rpo.orchestration.driver import read_metrics
from small_run import small_train

pytestmark = pytest.mark.slow


def test_sd3_trains_three_iterations(warm, world, scorer_url, tmp_path):
    # on the committed SD3 world (assets/shapes-world-sd3)
    from diffusers import SD3Transformer2DModel
    from g2rpo.common.paths import DEFAULT_WORLD

    sd3 = DEFAULT_WORLD.parent / "shapes-world-sd3" / "pipeline"
    # one SDE step: one group and one optimizer step, so every ratio is taken before it
    # (with 2, the second group's ratios after the first step were 0.4% off on this world)
    extra = [f"model.pretrained={sd3}", "model.guidance=4.5", "sampling.sde_steps=[0]"]
    run = small_train(world, tmp_path, "sd3", 3, extra, reward_url=scorer_url, warm=warm)
    rows = read_metrics(run)
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["transitions"] == 2 * 1 * 1 * 4  # workers · prompts · K · G
        assert "eval/shapes_clip" in r and r["optimizer_steps"] == 1
    # the learner's log-probs are the worker's: both see the guided velocity v_u + s(v_c − v_u)
    assert abs(rows[0]["ratio_min"] - 1) < 1e-5 and abs(rows[0]["ratio_max"] - 1) < 1e-5
    final = SD3Transformer2DModel.from_pretrained(run / "final" / "transformer")
    base = SD3Transformer2DModel.from_pretrained(sd3 / "transformer")
    moved = [
        not torch.equal(a, b)
        for a, b in zip(final.state_dict().values(), base.state_dict().values(), strict=True)
    ]
    assert any(moved)  # it trained, and the export is SD3's layout


def test_qwen_image_trains_three_iterations(warm, world, scorer_url, tmp_path):
    # on the committed Qwen-Image world (assets/shapes-world-qwenimage)
    from diffusers import QwenImageTransformer2DModel
    from g2rpo.common.paths import DEFAULT_WORLD

    qwen = DEFAULT_WORLD.parent / "shapes-world-qwenimage" / "pipeline"
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


@pytest.mark.parametrize("family", ["sd3", "qwenimage"])
def test_compare_runs_and_evaluates_each_family(family, warm, world, scorer_url, tmp_path):
    # `g2rpo compare` (in-process, the session's warm actors) of two methods on each
    # family's random pipeline: trained, then evaluated on fixed noise through the
    # family's own loader, guidance and σ grid
    import json

    from g2rpo.common.config.loading import dump_config, load_config
    from g2rpo.evaluation.compare import compare
    from g2rpo.evaluation.compare_spec import load_spec
    from g2rpo.orchestration.warm_trainer import WarmTrainer
    from small_run import SMALL_RUN

    if family == "sd3":
        from g2rpo.world.sd3_random import build_random_sd3_pipeline as build

        extra = ["model.guidance=4.5"]
    else:
        from g2rpo.world.qwenimage_random import build_random_qwenimage_pipeline as build

        extra = ["model.guidance=4.0", "model.quantize_timestep=false"]
    pipeline = build(tmp_path / family, seed=3)
    base = load_config(
        None,
        [
            *SMALL_RUN,
            *extra,
            f"model.pretrained={pipeline}",
            "sampling.sigma_grid=diffusers",
            f"train.reward.urls=[{scorer_url}]",
            "train.eval.on_actor=false",
            "train.checkpoints.every=5",
        ],
    )
    (tmp_path / "base.yaml").write_text(dump_config(base))
    (tmp_path / "spec.yaml").write_text(
        f"""
name: {family}
output_dir: {tmp_path / "out"}
base_config: {tmp_path / "base.yaml"}
seeds: [0]
methods:
  g2rpo: {{label: G2RPO}}
  flowgrpo_fast:
    set: [algorithm.name=flowgrpo_fast, optim.step_mode=per_samples]
budget: {{iterations: 1}}
eval: {{splits: [held_out], prompts_per_split: 2, samples_per_prompt: 2}}
"""
    )
    root = compare(load_spec(tmp_path / "spec.yaml"), progress=False, train_one=WarmTrainer(warm))
    results = json.loads((root / "results.json").read_text())
    assert list(results["methods"]) == ["g2rpo", "flowgrpo_fast"]
    for run in results["runs"]:
        assert run["finished"]["reason"] == "iterations" and run["iterations"] == 1
        assert "shapes_clip" in run["views"]["budget"]["held_out"]["vs_base"]
