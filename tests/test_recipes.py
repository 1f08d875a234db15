"""The shipped recipes: every config validates, and each GPU recipe (FLUX.1-dev's,
SD3.5-Medium's) is a complete
cluster run — its ``# hardware:`` header names the GPUs it asks Ray for, every actor
that runs the model asks for a GPU, its prompts and reward scorers are files and
directories rather than the tiny world's, and its learning rate suits what it trains."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from g2rpo.common.config.loading import config_from_dict, load_config
from g2rpo.common.config.run import G2RPOConfig

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
ALL = sorted(CONFIGS.glob("*.yaml"))
# the GPU recipes: FLUX.1-dev's and SD3.5-Medium's (a cluster path each)
FLUX = [p for p in ALL if "FLUX" in (load_config(p).model.pretrained or "")]
SD35 = [p for p in ALL if "stable-diffusion-3.5" in (load_config(p).model.pretrained or "")]
GPU_RECIPES = FLUX + SD35
HARDWARE = re.compile(r"^# hardware: (\d+) x (\d+(?:\.\d+)?)GiB GPUs$", re.M)

# The highest full fine-tune rate the references use or recommend (DanceGRPO's README:
# 5e-6 to 2e-5; G²RPO 2e-6, DanceGRPO and MixGRPO 1e-5), and the lowest LoRA rate they use
# (Flow-GRPO and DanceGRPO: 3e-4); G²RPO's single-node LoRA recipe takes 1e-4.
FULL_LR_MAX = 2e-5
LORA_LR_MIN = 1e-4


def gpus_asked(cfg: G2RPOConfig) -> int:
    """Whole GPUs the config asks Ray for: every actor's num_gpus summed (actors with
    fractional shares pack onto shared GPUs; each rank of a learner group holds a whole
    GPU of its own; a colocated worker and rank share the one GPU of their bundle),
    rounded up."""
    t = cfg.train
    if t.placement == "colocated":
        pairs = t.learner.count  # each bundle holds one GPU (the configs here ask for it)
    else:
        pairs = t.workers.count * t.workers.num_gpus + t.learner.count * (
            t.learner.num_gpus if t.learner.count == 1 else 1.0
        )
    # replicas in the pairs (train.reward.in_pairs) take shares of the pairs' GPUs
    reward = 0.0 if t.reward.in_pairs else t.reward.job_replicas() * t.reward.num_gpus
    total = pairs + (t.eval.num_gpus if t.eval.on_actor else 0.0) + reward
    return math.ceil(total - 1e-9)


def test_gpus_asked_counts_every_actor():
    layout = {
        "workers": {"count": 16, "num_gpus": 1},
        "learner": {"count": 8, "num_gpus": 1},
        "eval": {"num_gpus": 1},
        "reward": {"replicas": 2, "num_gpus": 0.5},
    }
    assert gpus_asked(config_from_dict({"train": layout})) == 16 + 8 + 1 + 1
    no_eval = config_from_dict({"train": layout}, ["train.eval.on_actor=false"])
    assert gpus_asked(no_eval) == 25
    shared = config_from_dict(
        {"train": layout},
        ["train.workers.num_gpus=0.5", "train.learner.count=16", "train.learner.num_gpus=0.5"],
    )
    # each of the 16 ranks holds a GPU of its own: sharing one with a worker needs
    # colocated placement, which this layout is not
    assert gpus_asked(shared) == 8 + 16 + 1 + 1
    # the same pairs colocated: worker i and rank i in bundle i, one GPU each
    colocated = config_from_dict(
        {"train": layout},
        [
            "train.workers.num_gpus=0.5",
            "train.learner.count=16",
            "train.learner.num_gpus=0.5",
            "train.placement=colocated",
        ],
    )
    assert gpus_asked(colocated) == 16 + 1 + 1
    # the reward replicas inside two of the pairs (train.reward.in_pairs): no GPU of their own
    in_pairs = config_from_dict(
        {"train": layout},
        [
            "train.workers.num_gpus=0.45",
            "train.learner.count=16",
            "train.learner.num_gpus=0.45",
            "train.reward.num_gpus=0.1",
            "train.reward.in_pairs=true",
            "train.placement=colocated",
        ],
    )
    assert gpus_asked(in_pairs) == 16 + 1
    # the flagship recipe as shipped before: 16 workers, 1 learner, an evaluator, 2 x 0.5
    before = {**layout, "learner": {"num_gpus": 1}}
    assert gpus_asked(config_from_dict({"train": before})) == 19


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_config_validates(path):
    cfg = load_config(path)
    cfg.model.check_trainable()


def test_flux_recipes_found():
    assert len(FLUX) >= 7, [p.name for p in FLUX]
    assert {p.name for p in SD35} >= {"flowgrpo_sd35.yaml", "g2rpo_sd35.yaml"}


@pytest.mark.parametrize("path", GPU_RECIPES, ids=lambda p: p.name)
def test_hardware_header_equals_what_ray_is_asked(path):
    cfg = load_config(path)
    found = HARDWARE.findall(path.read_text())
    assert len(found) == 1, f"{path.name}: needs one '# hardware: N x MGiB GPUs' line"
    gpus, gib = int(found[0][0]), float(found[0][1])
    assert gpus == gpus_asked(cfg), f"{path.name}: header {gpus}, asks Ray {gpus_asked(cfg)}"
    assert gib == cfg.train.memory.gpu_memory_gib


@pytest.mark.parametrize("path", GPU_RECIPES, ids=lambda p: p.name)
def test_model_actors_ask_for_gpus(path):
    cfg = load_config(path)
    t = cfg.train
    assert cfg.model.device.startswith("cuda")
    assert t.workers.num_gpus > 0 and t.learner.num_gpus > 0
    assert t.eval.num_gpus > 0 or not t.eval.on_actor
    assert t.reward.job_replicas() == 0 or t.reward.num_gpus > 0


@pytest.mark.parametrize("path", GPU_RECIPES, ids=lambda p: p.name)
def test_prompts_and_scorers_are_paths(path):
    cfg = load_config(path)
    t = cfg.train
    for prompts in (t.prompts, t.eval.prompts):
        assert prompts.startswith("/") and prompts.endswith(".txt"), prompts
    scorers = dict(s.split("=", 1) for s in t.reward.scorers if "=" in s)
    for reward in cfg.rewards:
        assert scorers.get(reward.name, "").startswith("/"), f"{reward.name} has no directory"


@pytest.mark.parametrize("path", GPU_RECIPES, ids=lambda p: p.name)
def test_learning_rate_suits_what_is_trained(path):
    cfg = load_config(path)
    if cfg.model.lora is None:
        assert cfg.optim.lr <= FULL_LR_MAX, f"full fine-tune at a LoRA rate {cfg.optim.lr}"
        assert cfg.train.learner.count > 1 and cfg.model.gradient_checkpointing
    else:
        assert cfg.optim.lr >= LORA_LR_MIN, f"LoRA at a full fine-tune rate {cfg.optim.lr}"
