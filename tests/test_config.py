from pathlib import Path

import pytest
import torch
from g2rpo.common.config import ConfigError, G2RPOConfig, dump_config, load_config

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))


def test_defaults_are_the_paper_settings():
    cfg = load_config(None)
    assert cfg.sampling.num_steps == 16 and cfg.sampling.group_size == 12
    assert cfg.sampling.sde_steps == list(range(8)) and cfg.sampling.granularities == [1, 2]
    assert cfg.sampling.eta == 0.7 and cfg.sampling.shift == 3.0
    assert cfg.optim.clip_range == 1e-4 and cfg.optim.adv_clip == 5.0
    assert cfg.optim.step_mode == "per_sde_step" and cfg.sampling.terminal == "exact"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_load(path):
    cfg = load_config(path)
    assert isinstance(cfg, G2RPOConfig)
    # round trip through YAML
    assert load_config(None, []).model_validate(cfg.model_dump()) == cfg
    assert "sampling:" in dump_config(cfg)


def test_overrides_parse_yaml_values(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("sampling:\n  group_size: 8\n")
    cfg = load_config(
        f,
        [
            "sampling.granularities=[1,2,3]",
            "optim.lr=1e-5",
            "algorithm.mixgrpo.roll_back=false",
            "run.name=x=y",
        ],
    )
    assert cfg.sampling.group_size == 8 and cfg.sampling.granularities == [1, 2, 3]
    assert cfg.optim.lr == 1e-5 and cfg.algorithm.mixgrpo.roll_back is False
    assert cfg.run.name == "x=y"


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("sampling.group_size=1", "sampling.group_size"),
        ("sampling.group_size=1", "(got 1)"),
        ("optim.lrr=3", "optim.lrr"),
        ("sampling.sde_steps=[0,15]", "[15]"),
        ("sampling.granularities=[0]", "sampling.granularities"),
        ("algorithm.name=ppo", "algorithm.name"),
        ("sampling.terminal=last", "'last'"),
        ("rewards=[]", "rewards"),
        ("optim.step_mode=sometimes", "optim.step_mode"),
        ("novalue", "section.field=value"),
        ("sampling.group_size.x=3", "sampling.group_size"),
        ("sampling=3", "sampling"),
        ("train.learners=0", "train.learners"),
        ("train.weight_transport=nccl", "train.weight_transport"),
        ("train.collective_timeout_s=0", "train.collective_timeout_s"),
        ("model.rollout_weights_dtype=bfloat16", "model.rollout_weights_dtype bfloat16 needs"),
        ("model.mixed_precision=fsdp", "model.mixed_precision fsdp computes in model.dtype"),
        ("model.mixed_precision=sometimes", "model.mixed_precision"),
    ],
)
def test_bad_values_name_the_field(override, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert needle in str(err.value)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sampling: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("3\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(scalar)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["model.rollout_weights_dtype=bfloat16", "model.lora.rank=4"], "model.dtype bfloat16"),
        (
            ["model.dtype=bfloat16", "model.rollout_weights_dtype=bfloat16", "model.lora.rank=4"],
            "a LoRA run (model.lora)",
        ),
        (
            ["model.dtype=bfloat16", "model.mixed_precision=fsdp", "model.lora.rank=4"],
            "use autocast",
        ),
    ],
)
def test_precision_settings_that_cannot_work_are_refused(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert needle in str(err.value)
    ok = load_config(None, ["model.dtype=bfloat16", "model.rollout_weights_dtype=bfloat16"])
    assert ok.model.rollout_weights_torch_dtype() == torch.bfloat16
    assert load_config(None, []).model.rollout_weights_torch_dtype() == torch.float32


def test_learner_ranks_sharing_a_gpu_are_refused_on_cuda():
    shared = ["model.device=cuda", "train.learners=2", "train.learner_num_gpus=0.5"]
    with pytest.raises(ConfigError, match=r"train.learner_num_gpus 0.5 .* NCCL refuses"):
        load_config(None, shared)
    # one rank on half a GPU (beside a reward replica), or a CPU group, is fine
    assert load_config(None, [*shared[:1], "train.learner_num_gpus=0.5"]).train.learners == 1
    assert load_config(None, ["train.learners=2", "train.learner_num_gpus=0"]).train.learners == 2
