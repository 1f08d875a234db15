"""deploy/'s docker-compose file and images: compose's services publish on loopback and
mount files that exist, the `g2rpo train` command its header documents plans and matches
its ports, token and scorers; the Dockerfiles COPY what exists and run as a user, both
images carry the folders the package installs (the committed world, the configs), and the
reward-server image's requirements are all that serving imports. (The Kubernetes
manifests: tests/test_deploy.py.)"""

import json
import shlex
import sys
from pathlib import Path

import yaml
from deploy_render import DEPLOY, REPO, _config_of, _plan


def test_compose_and_dockerfiles_point_at_what_exists():
    compose_dir = DEPLOY / "compose"
    compose = yaml.safe_load((compose_dir / "docker-compose.yaml").read_text())
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (compose_dir / source).exists(), f"{name}: {source}"
    assert {"redis", "reward-1", "reward-2", "prometheus", "grafana"} == set(compose["services"])
    root = DEPLOY.parent
    for dockerfile in (DEPLOY / "docker").glob("Dockerfile*"):
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY ") and "--from=" not in line:
                for src in line.split()[1:-1]:
                    assert (root / src).exists(), f"{dockerfile.name}: COPY {src}"
        assert "USER " in dockerfile.read_text()  # never root at run time


def test_compose_documents_a_training_run_it_serves():
    """The `g2rpo train` command docker-compose's header documents runs a config of the
    repo that `g2rpo plan` passes on one host, against this compose file: its Redis port,
    the replicas' token variable (exported in the same shell) and scorers, the metrics
    port Prometheus scrapes; and the header says where its run directory lands."""
    compose_dir = DEPLOY / "compose"
    text = (compose_dir / "docker-compose.yaml").read_text()
    header = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("#")]
    start = next(i for i, ln in enumerate(header) if ln.startswith("g2rpo train "))
    command = []
    for line in header[start:]:
        command.append(line.rstrip("\\").strip())
        if not line.endswith("\\"):
            break
    args = shlex.split(" ".join(command), comments=True)
    config = args[args.index("--config") + 1]
    sets = tuple(args[i + 1] for i, a in enumerate(args) if a == "--set")
    redis = args[args.index("--redis-url") + 1]
    assert (REPO / config).is_file(), config
    recipe = (REPO / config).read_text()
    cfg = _config_of(recipe, sets)
    plan = _plan(recipe, sets)
    assert plan["fits"] and plan["gpus_asked"] <= 8, "not a one-host run g2rpo plan passes"

    compose = yaml.safe_load(text)
    services = compose["services"]
    (published,) = services["redis"]["ports"]
    assert redis.startswith(f"redis://{published.rsplit(':', 1)[0]}/"), (redis, published)
    assert cfg.train.reward.job_replicas(redis) == 0  # the compose replicas, not its own
    token = cfg.train.reward.token_env
    assert f"export {token}=" in text, "the token must reach the training shell too"
    for name in ("reward-1", "reward-2"):
        command = services[name]["command"]
        assert command[command.index("--token-env") + 1] == token
        assert token in services[name]["environment"]
        served = command[command.index("--scorers") + 1].split(",")
        assert {r.name for r in cfg.rewards} <= set(served), (name, served)
    targets = json.loads((compose_dir / "targets/train.json").read_text())
    assert targets[0]["targets"][0].endswith(f":{cfg.train.metrics.port}"), targets
    where = Path(cfg.run.output_dir) / cfg.run.name
    assert f"./{where}" in text or str(where) in text, f"the header never says {where}"


def _copied_into_src(dockerfile: Path) -> set[str]:
    sources = set()
    for line in dockerfile.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["COPY"] and "--from=" not in line and parts[-1].startswith("/src"):
            sources.update(parts[1:-1])
    return sources


def test_the_images_carry_what_their_commands_need():
    """Both images `pip install /src`: each copies every folder pyproject's package-dir
    installs, the package data among them (the committed world, the configs), so that
    docker-compose's reward servers find shapes_clip's default model and the CPU
    overlay's `--config configs/tiny.yaml` resolves (tests/test_packaging.py installs a
    wheel built from that set and runs from it)."""
    import re

    import tomllib
    from g2rpo.common.paths import DEFAULT_WORLD, PROJECT_ROOT

    tool = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {target.split("/")[0] for target in tool["package-dir"].values()}
    assert {"assets", "configs"} <= folders
    for name in ("Dockerfile", "Dockerfile.reward"):
        copied = _copied_into_src(DEPLOY / "docker" / name)
        assert folders | {"pyproject.toml", "README.md"} <= copied, f"{name} lacks some"

    # the scorers the compose replicas and the CPU overlay serve from their default dirs
    compose = yaml.safe_load((DEPLOY / "compose/docker-compose.yaml").read_text())
    texts = [" ".join(s["command"]) for n, s in compose["services"].items() if "reward" in n]
    texts.append((DEPLOY / "k8s/overlays/cpu/kustomization.yaml").read_text())
    served = {
        name
        for text in texts
        for value in re.findall(r"--scorers[= ]([\w,=./-]+)", text)
        for name in value.split(",")
        if "=" not in name
    }
    assert "shapes_clip" in served
    world = DEFAULT_WORLD.relative_to(PROJECT_ROOT)
    assert world.parts[0] in folders  # shapes_clip's default, DEFAULT_WORLD/shapes_clip
    assert (DEFAULT_WORLD / "shapes_clip" / "model.safetensors").is_file()


def test_the_reward_server_imports_only_its_image_requirements():
    """Dockerfile.reward installs the project with --no-deps plus reward-requirements.txt:
    serving every scorer kind must not need the project's other dependencies. transformers
    imports some of them (jinja2, scipy, accelerate) only when they are installed; g2rpo's
    own modules must import none."""
    import re
    import subprocess

    import tomllib

    project = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]

    def names(reqs):
        return {re.split(r"[<>=\[ ;]", r.strip(), maxsplit=1)[0].lower() for r in reqs if r.strip()}

    wanted = (DEPLOY / "docker/reward-requirements.txt").read_text().splitlines()
    allowed = names(r for r in wanted if not r.startswith("#")) | {"torch"}
    excluded = names(project["dependencies"]) - allowed
    assert {"ray", "diffusers", "peft", "matplotlib"} <= excluded
    code = (
        "from g2rpo.cli import build_parser\n"
        "from g2rpo.reward_server.app import create_app\n"
        "from g2rpo.reward_server.settings import ServerSettings, ScorerSpec\n"
        "from g2rpo.reward_server.scorers import clip_score, image_reward, shapes_oracle, jpeg\n"
        "from g2rpo.reward_server.convert import convert_reward\n"
        "create_app(ServerSettings(scorers=[ScorerSpec(name='shapes_oracle')]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stderr.splitlines()
    # the import tree, parents after children: walk it keeping each line's parent
    parents: dict[int, str] = {}
    importers: dict[str, str] = {}
    for line in reversed(lines):
        if not line.startswith("import time:") or "imported package" in line:
            continue
        field = line.split("|")[2]
        depth = (len(field) - len(field.lstrip())) // 2
        name = field.strip()
        parents[depth] = name
        top = name.split(".")[0].replace("_", "-").lower()
        if top in excluded and depth > 0:
            importers.setdefault(top, parents[depth - 1])
    ours = {pkg: by for pkg, by in importers.items() if by.startswith("g2rpo")}
    assert not ours, f"g2rpo modules import packages the reward image lacks: {ours}"
    assert importers.keys() <= {"jinja2", "scipy", "accelerate"}, importers
