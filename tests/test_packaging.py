"""A non-editable install works away from the checkout: the wheel carries the committed
world and the configs as package data, and the relative paths the configs and the
commands use (``assets/shapes-world/pipeline``, ``configs/tiny.yaml``) resolve inside
the installed package. The wheel is built from a copy of exactly what
deploy/docker/Dockerfile copies, and installed into a fresh venv that sees this venv's
packages (nothing is downloaded)."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
WORLD_FILES = [
    "world.json",
    "pipeline/model_index.json",
    "pipeline/transformer/diffusion_pytorch_model.safetensors",
    "pipeline/vae/diffusion_pytorch_model.safetensors",
    "pipeline/text_encoder/model.safetensors",
    "pipeline/text_encoder_2/model.safetensors",
    "pipeline/tokenizer/tokenizer.json",
    "shapes_clip/model.safetensors",
    "shapes_clip/config.json",
]


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _run(cmd: list, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env or _env(), capture_output=True, text=True
    )
    assert out.returncode == 0, f"{cmd}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out


def _dockerfile_sources() -> set[str]:
    """What deploy/docker/Dockerfile copies into /src before `pip install /src`."""
    sources = set()
    for line in (ROOT / "deploy/docker/Dockerfile").read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["COPY"] and parts[-1].startswith("/src"):
            sources.update(parts[1:-1])
    return sources


def test_relative_paths_try_the_working_dir_then_the_project(tmp_path, monkeypatch):
    """In the checkout (the editable install) as in the wheel: the working dir's file
    wins; otherwise the one under the project root; configs also by bare name."""
    from g2rpo.common.config.loading import load_config
    from g2rpo.common.errors import ConfigError
    from g2rpo.common.paths import PROJECT_ROOT, find_config, resolve_path

    monkeypatch.chdir(tmp_path)
    assert PROJECT_ROOT == ROOT
    pipeline = "assets/shapes-world/pipeline"
    assert resolve_path(pipeline) == ROOT / pipeline
    assert (
        find_config("configs/tiny.yaml") == find_config("tiny.yaml") == ROOT / "configs/tiny.yaml"
    )
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs/tiny.yaml").write_text("run: {name: mine}\n")
    assert find_config("configs/tiny.yaml") == Path("configs/tiny.yaml")
    assert load_config("configs/tiny.yaml").run.name == "mine"
    assert load_config("tiny.yaml").run.name == "tiny"  # ./tiny.yaml absent: the shipped one
    assert resolve_path("nowhere/model") == Path("nowhere/model")
    with pytest.raises(ConfigError, match=r"config file not found: absent\.yaml \(looked at"):
        load_config("absent.yaml")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, Path]:
    """Build the wheel, install it into a fresh venv; returns the wheel, the venv's
    ``g2rpo`` command and its python."""
    tmp = tmp_path_factory.mktemp("packaging")
    src = tmp / "src"
    src.mkdir()
    for name in sorted(_dockerfile_sources()):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, src / name)
    # this venv's setuptools builds it (build isolation would fetch one from PyPI)
    _run(
        [
            *(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"),
            *("-w", tmp / "dist", src),
        ],
        cwd=tmp,
    )
    (wheel,) = (tmp / "dist").glob("g2rpo-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp)
    python = venv / "bin" / "python"
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp)
    # the new venv sees this venv's packages (torch, diffusers, ...) as plain paths: their
    # .pth files, the editable g2rpo's finder among them, are not run, so `g2rpo` can only
    # come from the wheel
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    Path(purelib.stdout.strip(), "test-deps.pth").write_text("\n".join(sorted(ours)) + "\n")
    # --ignore-installed: pip must not touch the editable g2rpo it sees through the .pth
    _run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", wheel],
        cwd=tmp,
    )
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return {"wheel": wheel, "g2rpo": venv / "bin" / "g2rpo", "python": python, "cwd": elsewhere}


def test_the_wheel_carries_the_world_and_the_configs(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    for rel in WORLD_FILES:
        assert f"g2rpo/assets/shapes-world/{rel}" in names, rel
    shipped = {n.removeprefix("g2rpo/configs/") for n in names if n.startswith("g2rpo/configs/")}
    committed = {str(p.relative_to(ROOT / "configs")) for p in (ROOT / "configs").rglob("*.yaml")}
    assert committed <= shipped
    assert "tiny.yaml" in shipped and "compare/methods.yaml" in shipped


def test_the_installed_package_resolves_the_shipped_paths(installed):
    """From a directory that is not the checkout: the package is the wheel's, a config
    found by its checkout path and by its bare name, its model path found in the
    package, and a missing config's error naming every place looked at."""
    code = (
        "import json, g2rpo\n"
        "from g2rpo.common.config.loading import load_config\n"
        "from g2rpo.common.paths import resolve_path\n"
        "from g2rpo.common.paths import DEFAULT_WORLD\n"
        "cfg = load_config('configs/tiny.yaml')\n"
        "assert load_config('tiny.yaml') == cfg\n"
        "print(json.dumps({'package': g2rpo.__file__, 'world': str(DEFAULT_WORLD),\n"
        "    'pipeline': str(resolve_path(cfg.model.pretrained))}))\n"
    )
    out = json.loads(_run([installed["python"], "-c", code], installed["cwd"]).stdout)
    site = installed["python"].parents[1] / "lib"
    package = Path(out["package"]).parent
    assert site in package.parents  # not the checkout's editable install
    assert Path(out["world"]) == package / "assets" / "shapes-world"
    assert Path(out["pipeline"]) == package / "assets" / "shapes-world" / "pipeline"
    assert (Path(out["pipeline"]) / "model_index.json").is_file()

    missing = subprocess.run(
        [installed["g2rpo"], "config", "show", "--config", "configs/absent.yaml"],
        cwd=installed["cwd"],
        env=_env(),
        capture_output=True,
        text=True,
    )
    assert missing.returncode != 0
    assert "config file not found: configs/absent.yaml" in missing.stderr
    assert str(package / "configs" / "absent.yaml") in missing.stderr


def test_a_job_working_dir_does_not_shadow_the_installed_package(installed):
    """`ray job submit --working-dir .` runs the entrypoint and every actor in the
    uploaded checkout with it first on PYTHONPATH. No folder of the checkout may then
    stand for the import name: the package, its parts and the command stay the wheel's,
    while a relative config resolves from the checkout (the working dir). A checkout
    folder ``g2rpo/`` holding only the command hid the installed package
    (``No module named 'g2rpo.common'``)."""
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    code = (
        "import json, g2rpo, g2rpo.cli, g2rpo.common.config.run, g2rpo.orchestration.driver\n"
        "print(json.dumps([m.__file__ for m in (g2rpo, g2rpo.cli, g2rpo.common.config.run,\n"
        "    g2rpo.orchestration.driver)]))\n"
    )
    files = json.loads(_run([installed["python"], "-c", code], ROOT, env).stdout)
    package = installed["python"].parents[1] / "lib"
    for file in map(Path, files):
        assert package in file.parents and ROOT not in file.parents, file

    assert "usage: g2rpo" in _run([installed["g2rpo"], "--help"], ROOT, env).stdout
    show = _run([installed["g2rpo"], "config", "show", "--config", "configs/tiny.yaml"], ROOT, env)
    assert "name: tiny" in show.stdout


def test_eval_world_runs_from_the_wheel_elsewhere(installed):
    """`g2rpo eval world` (the issue's failing command) on the shipped world, few samples."""
    command = ["eval", "world", "--samples-per-prompt", "1", "--grid", "grid.png", "--json"]
    out = _run([installed["g2rpo"], *command], installed["cwd"])
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["held_out"]["samples"] == report["held_out"]["prompts"] > 0
    assert report["shapes_clip_auc"] > 0.9  # the committed shapes_clip separates the pairs
    grid = installed["cwd"] / "grid.png"
    assert grid.read_bytes().startswith(b"\x89PNG")


def test_the_torch_requirement_admits_other_builds_and_the_tested_pin():
    """pyproject states the lowest torch the code needs (2.8: FSDPModule's
    set_gradient_divide_factor / set_force_sum_reduction_for_comms) and no upper bound, so
    a GPU node keeps its own build; constraints.txt pins the one tested here, and the
    images install that pin by default."""
    from packaging.requirements import Requirement

    (torch,) = [
        r for r in map(Requirement, PYPROJECT["project"]["dependencies"]) if r.name == "torch"
    ]
    pin = (ROOT / "constraints.txt").read_text().split("#")[0].strip()
    assert pin.startswith("torch==")
    tested = pin.removeprefix("torch==")
    for version in (tested, "2.8.0", "2.11.0+cu130", "2.14.0"):
        assert torch.specifier.contains(version), version
    assert not torch.specifier.contains("2.7.1")
    for name in ("Dockerfile", "Dockerfile.reward"):
        assert f"ARG TORCH={pin}\n" in (ROOT / "deploy/docker" / name).read_text(), name
