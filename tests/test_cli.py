"""The ``g2rpo`` console command, run as a real process."""

import json
import os
import shutil
import subprocess
import sys

import pytest

G2RPO = shutil.which("g2rpo") or os.path.join(os.path.dirname(sys.executable), "g2rpo")


def run(*args, timeout=300):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run(
        [G2RPO, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def test_bench_engine_json():
    out = run(
        "bench",
        "engine",
        "--quick",
        "--json",
        "--size",
        "test",
        "--latent-size",
        "4",
        "--steps",
        "8",
        "--group-size",
        "4",
        "--sde-steps",
        "0,1,2",
        "--granularities",
        "1,2,3",
        "--threads",
        "1",
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["parity_max_abs"] <= 1e-4
    assert result["nfe_batched"] == result["nfe_expected"] < result["nfe_unshared"]
    assert result["nfe_reference"] > result["nfe_batched"]
    assert result["model_calls_batched"] == 8
    assert result["speedup"] == pytest.approx(
        result["wall_reference_s"] / result["wall_batched_s"], rel=0.01
    )
    m = result["settings"]["model"]
    assert m["image_tokens"] == 4 and m["parameters"] > 0
    assert result["settings"]["granularities"] == [1, 2, 3]


def test_bench_engine_human_output():
    out = run(
        "bench",
        "engine",
        "--quick",
        "--size",
        "test",
        "--latent-size",
        "2",
        "--steps",
        "4",
        "--group-size",
        "2",
        "--sde-steps",
        "0",
        "--granularities",
        "1",
    )
    assert out.returncode == 0, out.stderr
    assert "speedup" in out.stdout and "NFEs" in out.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("bench", "engine", "--sde-steps", "0,x"), "comma-separated integers"),
        (("bench", "engine", "--size", "test", "--steps", "4", "--sde-steps", "3"), "T-2"),
        (("bench", "engine", "--device", "cuda"), "CUDA"),
        (("config", "show", "--set", "sampling.group_size=1"), "sampling.group_size"),
        (("config", "show", "--config", "/nonexistent.yaml"), "not found"),
    ],
)
def test_bad_input_is_a_clear_error(args, needle):
    out = run(*args)
    assert out.returncode == 2
    assert needle in out.stderr
    assert "Traceback" not in out.stderr


def test_config_show_resolves_overrides():
    out = run("config", "show", "--set", "sampling.granularities=[1,2,3]")
    assert out.returncode == 0, out.stderr
    assert "- 3" in out.stdout and "granularities" in out.stdout
