"""`g2rpo doctor`: the node check runs every phase on the committed world on CPU (its
CI run), on random weights in the world's architecture, and names the phase and
the field when one fails; on the stand-in accelerator it mixes no devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_accelerator import NAME, on_fake_gpu

REPO = Path(__file__).resolve().parents[1]
PHASES = [
    "host memory",
    "plan",
    "rollout worker",
    "learner",
    "publish",
    "rollout",
    "score",
    "precision",
    "learn",
    "evaluate",
]
# the committed recipe at a smaller rollout (the CI machine has 2 cores)
SMALL = ["--set", "sampling.sde_steps=[0, 1]", "--set", "sampling.group_size=4"]


# The doctor runs on a GPU node before Ray is there (the GPU machines we check on have
# none): with `import ray` made to fail, it must still pass. It did not at first
# (common/cluster/net.py imported Ray for a free port).
WITHOUT_RAY = "import sys; sys.modules['ray'] = None; from g2rpo.cli import main; sys.exit(main())"


def doctor(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY, "doctor", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_doctor_passes_every_phase_on_the_committed_world(tmp_path):
    rates = tmp_path / "calibration.jsonl"
    proc = doctor("configs/tiny.yaml", "--calibration-out", str(rates), "--json")  # as shipped
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = json.loads(proc.stdout)
    assert [p["phase"] for p in rep["phases"]] == PHASES
    assert all(p["ok"] for p in rep["phases"]), rep
    by = {p["phase"]: p for p in rep["phases"]}
    # 2 prompts x (the anchor + 4 SDE steps x G=8 branches completed at g=1 and g=2)
    rollout = by["rollout"]["details"]
    assert rollout["leaves"] == 2 * (1 + 4 * 8 * 2) and rollout["nfe"] > rollout["leaves"]
    assert rollout["nfe_per_s"] > 0 and rollout["flops_per_nfe"] > 0
    assert rollout["mfu"] is None  # no peak is known for a CPU
    # float32 on both sides: the ratio before any update is 1 to rounding
    assert by["precision"]["details"]["max_over_clip"] < 0.05
    learn = by["learn"]["details"]
    assert learn["optimizer_steps"] == 4 and learn["transitions"] == 2 * 4 * 8
    # each actor is set beside the plan's estimate of it
    assert by["rollout"]["plan_gib"] == by["plan"]["details"]["estimates_gib"]["rollout worker"]
    assert by["learn"]["plan_gib"] == by["plan"]["details"]["estimates_gib"]["learner rank"]
    check_the_time_estimate(by, rates)


def check_the_time_estimate(by: dict, rates: Path) -> None:
    """The plan's counts are the run's, and at the rates this run measured (its
    calibration rows) the plan's rollout is this rollout's time."""
    from g2rpo.common.config.loading import load_config
    from g2rpo.planning.calibration import Calibration, read_rates, shipped_rates
    from g2rpo.planning.timing import estimate_time
    from g2rpo.planning.workload import workload

    rows = read_rates(rates)
    assert {r.quantity for r in rows} == {
        "sample_tflops",
        "decode_tflops",
        "encode_s_per_prompt",
        "learn_tflops",
    }
    assert {(r.device, r.source, r.model) for r in rows} == {("cpu", "measured", "2+4x128")}
    one = load_config(REPO / "configs/tiny.yaml", ["train.workers.count=1"])  # one share
    work, rollout, learn = workload(one), by["rollout"]["details"], by["learn"]["details"]
    assert (work.nfe_per_worker, work.images_per_worker) == (rollout["nfe"], rollout["leaves"])
    assert work.learner_forwards == learn["learner_forwards"]
    assert work.optimizer_steps == learn["optimizer_steps"]
    measured_here = {r.quantity for r in rows}  # this run's rates, the table's transfers
    rest = [r for r in shipped_rates() if r.quantity not in measured_here]
    tm = estimate_time(one, Calibration("cpu", rows + rest))
    measured = rollout["encode_s"] + rollout["engine_s"] + rollout["decode_s"]
    assert tm.phases["rollout"] == pytest.approx(measured, rel=0.1)


def test_doctor_on_random_weights_in_the_world_architecture(tmp_path):
    proc = doctor(
        "configs/tiny.yaml",
        *SMALL,
        "--random-weights",
        "tiny",
        "--scorers",
        "shapes_oracle",
        "--work-dir",
        str(tmp_path),
        "--json",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = json.loads(proc.stdout)  # status lines went to stderr
    assert all(p["ok"] for p in rep["phases"]), rep
    assert str(tmp_path) in rep["architecture"]  # it ran on the random pipeline built there
    # the configured reward (shapes_clip) has a scorer here, but --scorers replaced it
    assert "rewards=" in proc.stderr and "shapes_oracle" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # and removed it


def test_doctor_names_the_failing_phase_and_field(tmp_path):
    missing = tmp_path / "no-such-prompts.txt"
    proc = doctor("configs/tiny.yaml", *SMALL, "--set", f"train.prompts={missing}")
    assert proc.returncode == 1
    assert "FAILED at phase 'rollout': look at train.prompts" in proc.stdout
    # what needs the rollout is skipped, the rest still ran
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    assert "skipped" in lines["score"] and "skipped" in lines["learn"]
    assert "pass" in lines["evaluate"]
    bad = doctor("configs/tiny.yaml", "--random-weights", "sdxl")
    assert bad.returncode == 2 and "--random-weights 'sdxl'" in bad.stderr


def test_doctor_phases_keep_their_tensors_on_the_device():
    from g2rpo.common.config.loading import load_config
    from g2rpo.planning.doctor import run_doctor

    cfg = load_config(
        REPO / "configs" / "tiny.yaml",
        [
            f"model.device={NAME}",
            "sampling.sde_steps=[0]",
            "sampling.group_size=3",
            "train.eval.samples=2",
        ],
    )
    with on_fake_gpu():
        rep = run_doctor(cfg, "tiny", progress=False)
    failed = [(p.phase, p.error) for p in rep.phases if not p.ok]
    assert failed == [], failed


def test_a_failure_names_only_real_config_fields():
    from g2rpo.planning.doctor_fields import field_of

    missing = OSError("no file named pytorch_model.bin, model.safetensors in /x")
    assert field_of("rollout worker", missing) == "model.pretrained"  # the phase's own
    assert field_of("rollout", ValueError("train.prompts /p: not found")) == "train.prompts"
    oom = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert field_of("precision", oom) == "train.learner.max_batch"


def test_the_fields_the_doctor_and_the_plan_point_at_are_real():
    from g2rpo.planning.doctor_fields import OOM_FIELDS, PHASE_FIELDS, is_config_field
    from g2rpo.planning.remedies import GPU_FIELDS

    for text in [*PHASE_FIELDS.values(), *OOM_FIELDS.values(), *GPU_FIELDS.values()]:
        for field in text.split(" / "):
            assert is_config_field(field), field
    assert not is_config_field("train.learner_max_batch")  # the flat name before the groups


@pytest.mark.parametrize("bad", ["2", "a,b", "-1,0"])
def test_doctor_refuses_bad_blocks(bad):
    proc = doctor("configs/tiny.yaml", "--random-weights", "tiny", "--blocks", bad)
    assert proc.returncode == 2 and "--blocks" in proc.stderr


def test_a_one_node_check_on_cuda_gives_each_model_actor_a_gpu():
    """`g2rpo doctor configs/tiny.yaml --device cuda` (and bench precision) were refused
    on an H200: the committed world's actors ask Ray for no GPU, which training rightly
    refuses on CUDA. The one-node checks place nothing through Ray: each kind without a
    GPU gets one, a fraction stays (the plan shares a GPU by it), CPU is left alone."""
    from g2rpo.common.cluster.one_node import device_overrides
    from g2rpo.common.config.loading import load_config
    from g2rpo.common.errors import ConfigError

    tiny = REPO / "configs" / "tiny.yaml"
    with pytest.raises(ConfigError, match=r"train\.workers\.num_gpus"):
        load_config(tiny, ["model.device=cuda"])
    cuda = device_overrides(tiny, ["sampling.group_size=4"], "cuda")
    assert cuda == [
        "sampling.group_size=4",
        "model.device=cuda",
        "train.workers.num_gpus=1",
        "train.learner.num_gpus=1",
        "train.eval.num_gpus=1",  # the evaluator is an actor of its own there
    ]
    cfg = load_config(tiny, cuda)
    assert cfg.model.device == "cuda" and cfg.train.workers.num_gpus == 1
    assert device_overrides(tiny, [], "cpu") == ["model.device=cpu"]
    assert device_overrides(tiny, ["a.b=1"], None) == ["a.b=1"]
    lora = REPO / "configs" / "flux_hps_lora_8gpu.yaml"
    assert device_overrides(lora, [], "cuda:1") == ["model.device=cuda:1"]
    assert load_config(lora, ["model.device=cuda:1"]).train.learner.num_gpus == 0.5
