"""The ``g2rpo`` console command, run as a real process."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

G2RPO = shutil.which("g2rpo") or os.path.join(os.path.dirname(sys.executable), "g2rpo")


def run(*args, timeout=300, env=None):
    env = dict(env or os.environ, HF_HUB_OFFLINE="1")
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
    # FLOPs per NFE are positive; TFLOP/s and the raw-forward ratio follow from the
    # measured times (one run); no peak is known for a CPU, so no MFU
    flops, eng, raw = result["flops_per_nfe"], result["engine"], result["raw_forward"]
    assert flops > 0 and eng["mfu"] is None and result["bf16_peak_tflops"] is None
    assert eng["tflops"] == pytest.approx(
        flops * result["nfe_batched"] / result["wall_batched_s"] / 1e12, rel=0.02, abs=1e-4
    )
    assert raw["batch"] == round(result["nfe_batched"] / result["model_calls_batched"])
    assert result["engine_vs_raw_forward"] == pytest.approx(
        eng["nfe_per_s"] / raw["nfe_per_s"], rel=0.01
    )


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


# refusals of a missing GPU: on a machine with one, the command runs instead
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("bench", "engine", "--sde-steps", "0,x"), "comma-separated integers"),
        (("bench", "engine", "--size", "test", "--steps", "4", "--sde-steps", "3"), "T-2"),
        pytest.param(("bench", "engine", "--device", "cuda"), "CUDA", marks=NO_CUDA),
        (("bench", "plan-memory", "--device", "cpu"), "CUDA allocator"),
        pytest.param(("bench", "plan-memory"), "no CUDA device", marks=NO_CUDA),
        (("config", "show", "--set", "sampling.group_size=1"), "sampling.group_size"),
        (("config", "show", "--config", "/nonexistent.yaml"), "not found"),
    ],
)
def test_bad_input_is_a_clear_error(args, needle):
    out = run(*args)
    assert out.returncode == 2
    assert needle in out.stderr
    assert "Traceback" not in out.stderr


BAD_CONFIGS = {  # file text, what the one line must say
    "unknown_key.yaml": ("sampling:\n  groupsize: 8\n", "sampling.groupsize: unknown field"),
    "wrong_type.yaml": ("train:\n  workers: {count: many}\n", "train.workers.count: Input should"),
    "old_layout.yaml": ("train:\n  worker_num_gpus: 1\n", "train.worker_num_gpus: unknown field"),
    "bad.yaml": ("sampling: [unclosed\n", "not valid YAML"),
    "scalar.yaml": ("3\n", "top level must be a mapping"),
    "cuda.yaml": (
        "model: {device: cuda}\n",
        "model.device is cuda but train.workers.num_gpus is 0",
    ),
    "missing.yaml": (None, "config file not found"),
}


def _bad_config(tmp_path, name) -> tuple[str, str]:
    text, needle = BAD_CONFIGS[name]
    if text is not None:
        (tmp_path / name).write_text(text)
    return str(tmp_path / name), needle


def _one_line_error(out, needle) -> None:
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.startswith("g2rpo: error: ") and needle in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("name", BAD_CONFIGS)
def test_a_bad_config_is_one_line_never_a_traceback(tmp_path, name):
    path, needle = _bad_config(tmp_path, name)
    _one_line_error(run("config", "show", "--config", path), needle)


@pytest.mark.parametrize("command", [("plan",), ("train", "--config"), ("doctor",)])
@pytest.mark.parametrize("name", ["wrong_type.yaml", "bad.yaml"])
def test_every_command_refuses_a_bad_config_in_one_line(tmp_path, command, name):
    path, needle = _bad_config(tmp_path, name)
    _one_line_error(run(*command, path, timeout=120), needle)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("train.bogus=1", "train.bogus: unknown field"),
        ("train.learner.max_batch=lots", "train.learner.max_batch: Input should be"),
        ("sampling.sde_steps=[0,1", "cannot parse value"),
        ("train.eval.resources={GPU: 1}", "train.eval.resources: give GPU through"),
    ],
)
def test_a_bad_override_is_one_line(override, needle):
    out = run("config", "show", "--set", override)
    _one_line_error(out, needle)
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_debug_shows_the_traceback():
    out = run("--debug", "config", "show", "--set", "sampling.group_size=1")
    assert out.returncode == 1
    assert "Traceback" in out.stderr and "ConfigError" in out.stderr
    assert "sampling.group_size" in out.stderr


def test_a_bug_shows_its_traceback():
    """Anything but the project's own errors (and a missing given file) is a bug: its
    traceback is printed, not hidden behind one line."""
    code = (
        "import sys, g2rpo.cli as cli\n"
        "def broken(args):\n"
        "    return {}['missing']\n"
        "cli._cmd_config_show = broken\n"
        "sys.exit(cli.main(['config', 'show']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "Traceback" in out.stderr and "KeyError: 'missing'" in out.stderr
    assert "g2rpo: error" not in out.stderr


def test_a_user_error_from_a_ray_actor_is_one_line(capsys, monkeypatch):
    """A RayTaskError carries the actor's exception as ``cause``: its message is shown,
    not the remote traceback; a bug in an actor keeps its traceback."""
    import g2rpo.cli as cli
    from g2rpo.common.errors import ModelPathError
    from ray.exceptions import RayTaskError

    def remote(cause):
        trace = f"Traceback (most recent call last):\n  ...\n{type(cause).__name__}: {cause}"
        return RayTaskError("Learner.ready", trace, cause).as_instanceof_cause()

    def missing_model(args):
        raise remote(ModelPathError("model.pretrained: local directory '/x' does not exist"))

    monkeypatch.setattr(cli, "_cmd_config_show", missing_model)
    assert cli.main(["config", "show"]) == 2
    err = capsys.readouterr().err
    assert err == "g2rpo: error: model.pretrained: local directory '/x' does not exist\n"

    def bug(args):
        raise remote(KeyError("x"))

    monkeypatch.setattr(cli, "_cmd_config_show", bug)
    with pytest.raises(KeyError):
        cli.main(["config", "show"])


def test_config_show_resolves_overrides():
    out = run("config", "show", "--set", "sampling.granularities=[1,2,3]")
    assert out.returncode == 0, out.stderr
    assert "- 3" in out.stdout and "granularities" in out.stdout


def test_bench_learner_json():
    out = run(
        "bench",
        "learner",
        "--json",
        "--size",
        "test",
        "--latent-size",
        "4",
        "--prompts",
        "1",
        "--group-size",
        "2",
        "--repeats",
        "1",
        "--lora-rank",
        "2",
        "--adamw",
        "foreach",
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    full, lora = result["full"], result["lora"]
    assert result["settings"]["adamw_kernel"] == "foreach"
    assert full["peak_gib"] is None  # the allocator's peak is CUDA's only
    assert result["settings"]["transitions"] == 1 * 4 * 2  # prompts · SDE steps · G
    assert full["forward_samples"] == lora["forward_samples"] == 4  # one per (prompt, k)
    assert full["optimizer_steps"] == 4  # per SDE step
    assert lora["trainable_parameters"] < full["trainable_parameters"]
    # frozen base weights need no weight gradients: fewer FLOPs per update
    assert 0 < lora["flops_per_update"] < full["flops_per_update"]
    assert full["tflops"] > 0 and full["mfu"] is None


@pytest.mark.slow  # .ci/run --all: a benchmark command's servers or Ray (~50 CPU-s)
def test_bench_weights_json(ray_local):
    from servers import session_ray_env

    out = run(
        "bench",
        "weights",
        "--json",
        "--sizes",
        "test",
        "--workers",
        "2",
        "--repeats",
        "1",
        "--lora-rank",
        "2",
        timeout=600,
        env=session_ray_env(),  # on the session's Ray, as on a cluster: none of its own
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["settings"]["workers"] == [2]
    for n in (2,):
        full, half, lora = (result[f"test/{m}/w{n}"] for m in ("full", "full_bf16", "lora"))
        assert full["bytes"] == 4 * full["parameters"]  # fp32 weights, every one published
        assert half["bytes"] == full["bytes"] // 2  # what bfloat16 rollout weights push
        assert 0 < lora["bytes"] < full["bytes"] / 5  # adapters only
        for r in (full, half, lora):
            assert r["workers"] == n
            for path, ratio in (
                ("publish_and_load_s", "path_vs_floor"),
                ("broadcast_and_load_s", "broadcast_vs_floor"),
            ):
                assert r[path] > 0
                assert r[ratio] == pytest.approx(r[path] / r["put_get_one_worker_s"], rel=0.01)


def test_bench_weights_verify_gb_times_both_checksums_on_flux_shaped_tensors():
    out = run("bench", "weights", "--verify-gb", "0.2", "--repeats", "1", "--json", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["settings"]["verify_gb"] == 0.2
    # 3072x3072 and 3072x12288, alternating, until >= 0.2 GB: 3 fp32 tensors, 5 bf16
    fp32, bf16 = result["float32"], result["bfloat16"]
    assert (fp32["tensors"], fp32["bytes"]) == (3, 4 * 3072 * (2 * 3072 + 12288))
    assert (bf16["tensors"], bf16["bytes"]) == (5, 2 * 3072 * (3 * 3072 + 2 * 12288))
    for r in (fp32, bf16):
        assert r["sha256_vs_xxh3"] == pytest.approx(
            r["sha256_s_per_gb"] / r["xxh3_s_per_gb"], rel=0.01
        )
        assert r["xxh3_vs_host_copy"] == pytest.approx(
            r["xxh3_s_per_gb"] / r["host_copy_s_per_gb"], rel=0.01
        )
    bad = run("bench", "weights", "--verify-gb", "0", timeout=120)
    assert bad.returncode == 2 and "--verify-gb" in bad.stderr


def test_bench_health_costs_each_stage_per_image():
    out = run("bench", "health", "--sizes", "32,256", "--images", "8", "--repeats", "1", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert list(result) == ["32", "256"]
    for stages in result.values():
        assert set(stages) == {"per_image", "thumbnails", "against_base"}
        assert all(v >= 0 for v in stages.values())
    # 64x the pixels cost more
    assert result["256"]["per_image"] > result["32"]["per_image"]
    text = run("bench", "health", "--sizes", "32", "--images", "4", "--repeats", "1")
    assert "for an evaluation of 2048 samples" in text.stdout


def test_bench_weights_refuses_an_unknown_mode():
    out = run("bench", "weights", "--modes", "full,fp8", "--sizes", "test", timeout=120)
    assert out.returncode == 2 and "fp8" in out.stderr and "full_bf16" in out.stderr


def test_bench_precision_measures_the_ratio_before_any_update(world):
    """float32 on both sides reproduces the rollout's log-probs; bf16 rollout weights
    halve the bytes pushed and move the ratio off 1 (what the docs measure);
    FSDP2's mixed-precision learner runs on a one-rank group."""
    settings = "float32,bf16_rollout_weights,bf16_fsdp_learner"
    out = run(
        "bench",
        "precision",
        "--set",
        f"model.pretrained={world / 'pipeline'}",
        "--set",
        "sampling.group_size=4",
        "--set",
        "sampling.sde_steps=[0,1]",
        "--prompts",
        "1",
        "--settings",
        settings,
        "--json",
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    fp32, half, fsdp = (result[name] for name in settings.split(","))
    assert result["settings"]["transitions"] == 1 * 2 * 4  # prompts x SDE steps x G
    assert fp32["max_abs_ratio_minus_1"] < 1e-5  # only batch composition could differ
    assert half["published_bytes"] * 2 == fp32["published_bytes"] == fsdp["published_bytes"]
    assert half["max_abs_ratio_minus_1"] > fp32["max_abs_ratio_minus_1"]
    for r in (fp32, half, fsdp):
        assert 0 <= r["clipped_at_first_step"] <= 1
        assert r["max_over_clip"] == pytest.approx(r["max_abs_ratio_minus_1"] / 1e-4)
    bad = run("bench", "precision", "--settings", "fp8", timeout=120)
    assert bad.returncode == 2 and "fp8" in bad.stderr and "bf16_autocast" in bad.stderr


@pytest.mark.slow  # .ci/run --all: a benchmark command's servers or Ray (~50 CPU-s)
def test_bench_reward_serves_a_random_model_of_a_published_size():
    out = run(
        "bench",
        "reward",
        "--json",
        "--scorer",
        "hpsv2",
        "--random-model",
        "tiny",
        "--duration",
        "0.3",
        "--images-per-request",
        "4",
        "--image-size",
        "48",
        "--threads",  # one per server: the suite keeps both cores busy (conftest)
        "1",
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["scorer"] == "hpsv2" and result["random_model"] == "tiny"
    assert result["threads"] == 1
    assert [r["clients"] for r in result["batched"]] == [1, 8, 64]
    for r in result["batched"] + result["unbatched"]:
        assert r["requests"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0
    assert result["batching_gain"] > 0 and set(result["replicas"]) == {"1", "2"}
    bad = run("bench", "reward", "--random-model", "vit-z")
    assert bad.returncode == 2 and "vit-h-14" in bad.stderr
    bad = run("bench", "reward", "--threads", "0")
    assert bad.returncode == 2 and "--threads must be at least 1 (got 0)" in bad.stderr
