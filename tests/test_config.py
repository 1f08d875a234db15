from pathlib import Path

import pytest
import torch
from g2rpo.common.config.loading import dump_config, load_config
from g2rpo.common.config.run import G2RPOConfig
from g2rpo.common.errors import ConfigError

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


def test_the_k8s_config_map_loads():
    import yaml
    from g2rpo.common.config.loading import config_from_dict

    path = Path(__file__).parents[1] / "deploy" / "k8s" / "base" / "train-config.yaml"
    text = yaml.safe_load(path.read_text())["data"]["train.yaml"]
    cfg = config_from_dict(yaml.safe_load(text))
    assert cfg.run.output_dir == "/runs" and cfg.train.metrics.port == 9400


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
        ("train.learner.count=0", "train.learner.count"),
        ("train.weights.transport=nccl", "train.weights.transport"),
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
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00train: {}")
    with pytest.raises(ConfigError, match="cannot read it"):
        load_config(binary)
    with pytest.raises(ConfigError, match=r"line 1, column \d+"):  # one line, where it is
        load_config(None, ["sampling.sde_steps=[0,1"])


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


def test_fractional_gpus_are_refused_only_where_two_ranks_of_a_group_could_share_one():
    gpus = ["model.device=cuda", "train.workers.num_gpus=1", "train.eval.num_gpus=1"]
    # learner ranks sit in bundles of whole GPUs: a group at 0.5 each is planned, and
    # Ray reserves a GPU per rank
    group = load_config(None, [*gpus, "train.learner.count=2", "train.learner.num_gpus=0.5"])
    assert group.train.learner.reserved_gpus() == 1.0
    one = load_config(None, [*gpus, "train.learner.num_gpus=0.5"])  # beside a reward replica
    assert one.train.learner.reserved_gpus() == 0.5
    # the weight broadcast's group has no bundles: a fraction there is refused
    for kind in ("learner", "workers"):
        over = [*gpus, "train.learner.num_gpus=1", "train.weights.transport=collective"]
        over.append(f"train.{kind}.num_gpus=0.5")
        with pytest.raises(ConfigError, match=rf"train.{kind}.num_gpus 0.5.*NCCL refuses"):
            load_config(None, over)
    cpu = load_config(None, ["train.learner.count=2", "train.weights.transport=collective"])
    assert cpu.train.learner.count == 2


# ---------------------------------------------------------------- train's groups


def test_train_is_grouped_by_what_it_governs():
    from g2rpo.common.config.actor import ActorResources

    t = load_config(None).train
    for kind in (t.workers, t.learner, t.eval, t.reward):  # one reservation model for each
        assert isinstance(kind, ActorResources)
        assert (kind.num_cpus, kind.num_gpus, kind.resources) == (1.0, 0.0, {})
    assert (t.workers.count, t.workers.rollout_timeout_s) == (1, None)
    assert (t.learner.count, t.learner.max_batch) == (1, 64)
    assert (t.eval.every, t.eval.samples, t.eval.per_prompt, t.eval.on_actor) == (5, 40, 4, True)
    assert (t.weights.transport, t.weights.staleness) == ("object_store", 0)
    assert (t.checkpoints.every, t.checkpoints.at, t.checkpoints.keep) == (5, [], None)
    assert (t.memory.gpu_memory_gib, t.memory.ignore_plan) == (80.0, False)
    assert (t.metrics.port, t.metrics.host) == (None, "127.0.0.1")
    # every field says what it governs
    for group in (t.workers, t.learner, t.eval, t.weights, t.checkpoints, t.memory, t.metrics):
        for name, info in type(group).model_fields.items():
            assert info.description, f"{type(group).__name__}.{name} has no description"


def test_overrides_reach_nested_groups(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  workers: {count: 3, num_gpus: 0.5}\n  learner:\n    max_batch: 8\n")
    cfg = load_config(
        f,
        [
            "train.workers.resources={sampler: 1}",
            "train.learner.count=2",
            "train.eval.on_actor=false",
            "train.weights.staleness=1",
            "train.checkpoints.at=[3, 7]",
            "train.reward.num_gpus=0.25",
        ],
    )
    t = cfg.train
    assert (t.workers.count, t.workers.num_gpus, t.workers.resources) == (3, 0.5, {"sampler": 1})
    assert (t.learner.count, t.learner.max_batch) == (2, 8)
    assert t.eval.on_actor is False and t.weights.staleness == 1
    assert t.checkpoints.at == [3, 7] and t.reward.num_gpus == 0.25
    # the dump is the nested layout, and loads back to the same config
    dumped = dump_config(cfg)
    assert "  workers:\n    num_cpus: 1.0\n    num_gpus: 0.5\n" in dumped
    again = tmp_path / "again.yaml"
    again.write_text(dumped)
    assert load_config(again) == cfg


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        # the flat fields before the groups (and run directories written then) name the field
        ("train.worker_num_gpus=1", "train.worker_num_gpus: unknown field"),
        ("train.learners=2", "train.learners: unknown field"),
        ("train.eval_every=3", "train.eval_every: unknown field"),
        ("train.reward.start_local=false", "train.reward.start_local: unknown field"),
        ("train.workers=3", "train.workers: Input should be a valid dictionary"),
        ("train.workers.count=0", "train.workers.count"),
        ("train.eval.per_prompt=0", "train.eval.per_prompt"),
        ("train.checkpoints.keep=0", "train.checkpoints.keep"),
        ("train.metrics.port=70000", "train.metrics.port"),
        ("train.memory.gpu_memory_gib=0", "train.memory.gpu_memory_gib"),
        ("train.learner.resources={GPU: 1}", "train.learner.resources: give GPU through"),
        ("train.eval.resources={box: 0}", "train.eval.resources: box: amount must be > 0"),
        ("train.reward.resources={CPU: 2}", "train.reward.resources: give CPU through"),
    ],
)
def test_bad_group_values_name_the_field_path(override, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert needle in str(err.value)


@pytest.mark.parametrize("kind", ["workers", "learner", "eval"])
def test_cuda_actors_without_a_gpu_are_refused_naming_both_fields(kind):
    gpus = [f"train.{k}.num_gpus=1" for k in ("workers", "learner", "eval") if k != kind]
    with pytest.raises(ConfigError) as err:
        load_config(None, ["model.device=cuda", *gpus])
    assert f"model.device is cuda but train.{kind}.num_gpus is 0" in str(err.value)
    assert load_config(None, ["model.device=cuda", *gpus, f"train.{kind}.num_gpus=0.5"])


def test_cuda_without_a_gpu_for_the_evaluator_is_fine_when_it_is_no_actor():
    gpus = ["model.device=cuda:0", "train.workers.num_gpus=1", "train.learner.num_gpus=1"]
    with pytest.raises(ConfigError, match=r"model.device is cuda:0 but train.eval.num_gpus is 0"):
        load_config(None, gpus)
    assert not load_config(None, [*gpus, "train.eval.on_actor=false"]).train.eval.on_actor
    # a reward replica may score on the CPU beside a CUDA run
    assert load_config(None, [*gpus, "train.eval.num_gpus=1"]).train.reward.num_gpus == 0
