import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# One intra-op thread in this process and every process it starts (subprocesses and
# Ray workers inherit it). The suite keeps both cores busy, and a 2-thread torch op
# whose second thread is descheduled spins at its barrier: `g2rpo pretrain --quick`
# beside one busy loop took 45 s of wall and 51 CPU-s at 2 threads, 30 s and 28 CPU-s
# at 1 (alone: 25 s and 30 s).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest
import torch

# `g2rpo plan`'s trace cache (the doctor plans too): the session's own, never the
# user's ~/.cache/g2rpo/plan; subprocesses inherit it
_PLAN_CACHE = tempfile.TemporaryDirectory(prefix="g2rpo-plan-cache-")
os.environ["G2RPO_PLAN_CACHE"] = _PLAN_CACHE.name

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


class ElementwiseVelocity(torch.nn.Module):
    """v = a⊙x + b·t + c⊙cond: only elementwise ops, so each sample's output is
    bit-identical whatever batch it is computed in (exact-ratio tests need that)."""

    def __init__(self, shape: tuple[int, ...], seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.a = torch.nn.Parameter(0.3 * torch.randn(shape, generator=g) - 0.5)
        self.b = torch.nn.Parameter(0.3 * torch.randn(shape, generator=g))
        self.c = torch.nn.Parameter(0.3 * torch.randn(shape, generator=g))
        self.calls = 0
        self.nfe = 0

    def forward(self, x, timestep, cond):
        self.calls += 1
        self.nfe += x.shape[0]
        t = timestep.reshape(-1, *([1] * (x.ndim - 1)))
        return self.a * x + self.b * t + self.c * cond["text"]


@pytest.fixture
def toy_model():
    return ElementwiseVelocity((4, 3))


def toy_cond(num_prompts: int, shape=(4, 3), seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"text": torch.randn(num_prompts, *shape, generator=g)}


@pytest.fixture
def tiny_flux():
    from g2rpo.common.families.flux import FluxVelocity, build_tiny_flux

    return FluxVelocity(build_tiny_flux("test", seed=0), 4, 4)


def flux_cond(num_prompts: int, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "encoder_hidden_states": torch.randn(num_prompts, 5, 32, generator=g),
        "pooled_projections": torch.randn(num_prompts, 32, generator=g),
    }


WORLD = Path(__file__).resolve().parents[1] / "assets" / "shapes-world"


@pytest.fixture(scope="session")
def world() -> Path:
    """The committed default world (assets/shapes-world), the one README's train
    command uses: read by the tests, never written."""
    return WORLD


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the session's Ray tests (servers.start_local_ray), shut down
    at the end. tests/test_placement.py swaps in a two-node cluster of its own for its
    module and starts this one again after."""
    import ray
    from servers import start_local_ray

    if not ray.is_initialized():
        start_local_ray()
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def quick_world(tmp_path_factory):
    """`g2rpo pretrain --quick` run once per session as a real process (about 15 s):
    only tests/test_world.py, which checks what pretrain writes."""
    import subprocess

    from g2rpo.reward_server.process import g2rpo_executable

    out = tmp_path_factory.mktemp("world") / "w"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    res = subprocess.run(
        [
            g2rpo_executable(),
            "pretrain",
            "--quick",
            "--out",
            str(out),
            "--no-progress",
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "wrote" in res.stdout
    return out


@pytest.fixture(scope="session")
def scorer_url(world):
    """One reward server (a real `g2rpo reward-server` process) with the world's
    shapes_clip, for the session's small training runs."""
    from servers import RewardServerProcess

    server = RewardServerProcess("--scorers", f"shapes_clip={world / 'shapes_clip'}", quiet=True)
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def warm(ray_local):
    """Actors kept between the session's training runs in this process
    (orchestration/warm_actors.py): a run takes the workers and learner ranks the
    last one left instead of starting processes that import torch again."""
    from g2rpo.orchestration.warm_actors import WarmActors

    actors = WarmActors()
    yield actors
    actors.close()


# Training runs that several test files compare with. Each is the small setting of
# tests/small_run.py, trained once per session; tests read its directory, never write it.


@pytest.fixture(scope="session")
def calm_run(warm, world, scorer_url, tmp_path_factory):
    """The uninterrupted 3-iteration run (1 learner, weights by the object store)."""
    from small_run import small_train

    out = tmp_path_factory.mktemp("calm")
    return small_train(world, out, "calm", 3, reward_url=scorer_url, warm=warm)


@pytest.fixture(scope="session")
def calm_group_run(warm, world, scorer_url, tmp_path_factory):
    """The uninterrupted 3-iteration run of a 2-learner group (FSDP2 over gloo)."""
    from small_run import small_train

    out = tmp_path_factory.mktemp("calm-group")
    two = ["train.learner.count=2"]
    return small_train(world, out, "calm-group", 3, two, reward_url=scorer_url, warm=warm)


@pytest.fixture(scope="session")
def overlapped_run(warm, world, scorer_url, tmp_path_factory):
    """The uninterrupted 3-iteration overlapped run (train.weights.staleness=1, weights
    by the object store) of a 2-learner group: the worker-kill test under broadcast
    weights (tests/test_recovery.py) runs the same group, so one run checks broadcasts
    from a sharded group and from an overlapped iteration."""
    from small_run import small_train

    out = tmp_path_factory.mktemp("overlap")
    overlapped = ["train.weights.staleness=1", "train.learner.count=2"]
    return small_train(world, out, "overlap", 3, overlapped, reward_url=scorer_url, warm=warm)
