"""``g2rpo eval`` on the committed world: fixed noise makes a model compared with itself
(or with a zero LoRA) differ by exactly nothing; trained weights do differ; every
kind of target loads, and a wrong one is named."""

import json

import numpy as np
import pytest
import torch
from g2rpo.common.config.loading import load_config
from g2rpo.common.families.loaders import ModelPathError
from g2rpo.evaluation.eval_command import eval_command
from g2rpo.evaluation.policy import resolve_policy
from g2rpo.learner.trainer import LearnerCore
from small_run import SMALL_RUN
from test_cli import run

SMALL_EVAL = dict(splits=["held_out"], prompts_per_split=4, samples_per_prompt=2, num_steps=6)


def _scorers(world):
    return [f"shapes_clip={world / 'shapes_clip'}", "shapes_oracle"]


def _zero(summary):
    for split in summary["splits"].values():
        changes = {**split["vs_base"], **split["health"]["vs_base"]}
        for metric, iv in changes.items():
            assert (iv["mean"], iv["lo"], iv["hi"]) == (0.0, 0.0, 0.0), metric


def test_a_pipeline_against_itself_differs_by_exactly_nothing(world, tmp_path):
    pipe = world / "pipeline"
    summary, paths = eval_command(
        str(pipe),
        base=str(pipe),
        out=str(tmp_path / "ev"),
        progress=False,
        scorers=_scorers(world),
        **SMALL_EVAL,
    )
    _zero(summary)
    held = summary["splits"]["held_out"]
    assert held["prompts"] == 4 and held["samples"] == 8
    for part in ("pass", "bg", "fg", "shape"):
        iv = held["metrics"][f"shapes_oracle/{part}"]
        assert 0.0 <= iv["lo"] <= iv["mean"] <= iv["hi"] <= 1.0
    # the strict pass rate is the share of samples meeting all three criteria
    per_prompt = np.array(held["per_prompt"]["shapes_oracle/pass"])
    assert held["metrics"]["shapes_oracle/pass"]["mean"] == pytest.approx(per_prompt.mean())
    assert paths["grid"].stat().st_size > 5_000
    assert "model − base" in paths["markdown"].read_text()
    # the image-health measures, each with its paired change against the base
    health = held["health"]
    assert set(health["metrics"]) == set(health["vs_base"]) == {
        "high_freq", "periodicity", "saturation", "base_distance", "background_shift", "diversity",
        "diversity_embed",  # shapes_clip's image embedding
        "high_freq_p8", "high_freq_p16", "contrast", "sharpness", "glyph_area",  # issue 57
    }  # fmt: skip
    assert 0 < health["metrics"]["high_freq"]["mean"] < 1
    assert health["metrics"]["base_distance"]["mean"] == 0.0  # against itself
    assert "| held_out | health/diversity |" in paths["markdown"].read_text()


def test_an_untrained_lora_export_is_the_base_and_a_trained_one_is_not(world, tmp_path):
    cfg = load_config(
        None,
        [
            *SMALL_RUN,
            f"model.pretrained={world / 'pipeline'}",
            "model.lora.rank=4",
            "model.lora.alpha=8",
        ],
    )
    learner = LearnerCore(cfg)
    learner.export(str(tmp_path / "zero"))  # B = 0: exactly the base model
    summary, _ = eval_command(
        str(tmp_path / "zero"),
        base=str(world / "pipeline"),
        out=str(tmp_path / "ev0"),
        progress=False,
        scorers=_scorers(world),
        **SMALL_EVAL,
    )
    _zero(summary)
    with torch.no_grad():  # a (large) step away from the base
        for name, p in learner.transformer.named_parameters():
            if "lora_B" in name:
                p.add_(0.05 * torch.randn_like(p))
    learner.export(str(tmp_path / "moved"))
    moved, _ = eval_command(
        str(tmp_path / "moved"),
        base=str(world / "pipeline"),
        out=str(tmp_path / "ev1"),
        progress=False,
        scorers=_scorers(world),
        **SMALL_EVAL,
    )
    assert moved["splits"]["held_out"]["vs_base"]["shapes_clip"]["mean"] != 0.0
    assert moved["splits"]["held_out"]["health"]["vs_base"]["base_distance"]["lo"] > 0.0
    assert moved["model"]["kind"] == "lora"


def test_targets_are_recognised_and_wrong_ones_named(world, tmp_path):
    with pytest.raises(ModelPathError, match="does not exist"):
        resolve_policy(tmp_path / "nowhere")
    with pytest.raises(ModelPathError, match="neither a run directory"):
        resolve_policy(tmp_path)
    (tmp_path / "lora").mkdir()
    (tmp_path / "lora" / "pytorch_lora_weights.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="--base"):
        resolve_policy(tmp_path / "lora")
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(f"model: {{pretrained: {world / 'pipeline'}}}\n")
    (run_dir / "checkpoints" / "it_00002.pt").write_bytes(b"")
    with pytest.raises(ModelPathError, match="it_00002"):
        resolve_policy(run_dir, checkpoint="7")
    src = resolve_policy(run_dir)  # no final/: the latest checkpoint
    assert src.kind == "checkpoint" and src.weights.name == "it_00002.pt"


def test_eval_command_as_a_process(world, tmp_path):
    pipe = str(world / "pipeline")
    out = run(
        "eval",
        pipe,
        "--base",
        pipe,
        "--out",
        str(tmp_path / "ev"),
        "--splits",
        "train",
        "--prompts",
        "3",
        "--samples-per-prompt",
        "1",
        "--steps",
        "4",
        "--json",
        "--scorers",
        ",".join(_scorers(world)),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout)
    assert list(summary["splits"]) == ["train"] and summary["settings"]["num_steps"] == 4
    assert (tmp_path / "ev" / "eval.json").is_file()
    bad = run("eval", str(tmp_path / "missing"))
    assert bad.returncode == 2 and "does not exist" in bad.stderr
