import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))


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
    from g2rpo.common.flux import FluxVelocity, build_tiny_flux

    return FluxVelocity(build_tiny_flux("test", seed=0), 4, 4)


def flux_cond(num_prompts: int, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "encoder_hidden_states": torch.randn(num_prompts, 5, 32, generator=g),
        "pooled_projections": torch.randn(num_prompts, 32, generator=g),
    }


@pytest.fixture(scope="session")
def quick_world(tmp_path_factory):
    """`g2rpo pretrain --quick` run once per session as a real process (about a minute)."""
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
            "2",
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
