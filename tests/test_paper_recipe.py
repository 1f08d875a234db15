"""The paper's training recipes (configs/flux_hps.yaml, configs/flux_hps_clip.yaml):
they validate as shipped, and the HPS&CLIP recipe's structure — two reward models
fused 1:1, served by two job-started reward-server replicas — trains two iterations
on CPU (in this process, on the session's warm actors), with tiny HPS-v2.1 and DFN5B stand-ins
converted from their original OpenCLIP layout; every reward and its share of the
advantage is logged per iteration."""

import json
from pathlib import Path

import pytest
import torch
from g2rpo.common.config.loading import load_config
from g2rpo.orchestration.driver import train
from g2rpo.reward_server.convert import convert_reward
from g2rpo.reward_server.random_models import byte_level_clip_tokenizer
from reward_checkpoints import openclip_state_dict
from small_run import SMALL_RUN

# a training run, a Ray cluster or a service: `pytest -m 'not slow'` leaves it out
pytestmark = pytest.mark.slow

CONFIGS = Path(__file__).parents[1] / "configs"


def test_recipes_validate_with_the_official_settings():
    hps, both = (load_config(CONFIGS / n) for n in ("flux_hps.yaml", "flux_hps_clip.yaml"))
    for cfg in (hps, both):
        assert cfg.sampling.group_size == 12 and cfg.sampling.sde_steps == list(range(8))
        assert cfg.sampling.num_steps == 16 and cfg.sampling.eta == 0.7
        assert cfg.optim.lr == 2e-6 and cfg.optim.weight_decay == 1e-4
        assert cfg.optim.clip_range == 1e-4 and cfg.train.image_size == 720
    assert [(r.name, r.weight) for r in hps.rewards] == [("hpsv2", 1.0)]
    assert [(r.name, r.weight) for r in both.rewards] == [("hpsv2", 1.0), ("clip_score", 1.0)]
    # the two trained scorers, and PickScore held out (train.guard's drift, issue 57)
    assert [s.split("=")[0] for s in both.train.reward.scorers] == [
        "hpsv2",
        "clip_score",
        "pickscore",
    ]


def test_hps_clip_recipe_trains_two_iterations_with_converted_stand_ins(
    ray_local, warm, world, tmp_path
):
    tok = tmp_path / "tok"
    byte_level_clip_tokenizer().save_pretrained(tok)
    dirs = {}
    for kind, seed in (("hpsv2", 1), ("dfn5b_clip", 2)):
        torch.save({"state_dict": openclip_state_dict(seed=seed)}, tmp_path / f"{kind}.pt")
        dirs[kind] = tmp_path / kind
        convert_reward(kind, tmp_path / f"{kind}.pt", dirs[kind], tokenizer=tok)
    small = [s for s in SMALL_RUN if not s.startswith("rewards=")]
    overrides = [
        *small,
        f"model.pretrained={world / 'pipeline'}",
        "model.dtype=float32",
        "model.mixed_precision=autocast",
        "model.rollout_weights_dtype=float32",
        "train.learner.count=1",
        "model.device=cpu",
        "sampling.max_batch=64",
        "train.workers.num_gpus=0",
        "train.learner.num_gpus=0",
        "train.eval.num_gpus=0",
        "train.prompts=shapes:train",
        "train.eval.prompts=shapes:held_out",
        "train.reward.num_gpus=0",
        f"train.reward.scorers=[hpsv2={dirs['hpsv2']}, clip_score={dirs['dfn5b_clip']}]",
        f"run.output_dir={tmp_path / 'runs'}",
        "run.iterations=2",
    ]
    run = train(CONFIGS / "flux_hps_clip.yaml", overrides, progress=False, warm=warm)
    assert run == tmp_path / "runs" / "g2rpo-flux-hps-clip"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1]
    for r in rows:
        for name in ("hpsv2", "clip_score"):
            assert f"reward/{name}/g1" in r and f"reward/{name}/g2" in r
            assert 0 < r[f"adv_share/{name}"] < 1
        assert r["adv_share/hpsv2"] + r["adv_share/clip_score"] == pytest.approx(1.0)
    # the job started the recipe's two reward replicas, both serving both scorers
    actors = json.loads((run / "actors.json").read_text())
    assert len(set(actors["reward_servers"])) == 2, actors
