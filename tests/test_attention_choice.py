"""model.rollout_attention_backend: the rollout's SDPA kernel measured where it runs (the
fastest at the transformer's first attention shape) or named, and the learner left on
model.attention_backend. Every test here fails at 3bb9114 (no attention_choice module,
no for_rollout, no rollout_attention_backend). About 6 s, no compile."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import flux_cond

REPO = Path(__file__).resolve().parents[1]


def test_fastest_takes_the_least_time_among_kernels_that_ran():
    """Catches: a kernel that cannot run chosen; ties broken by dict order."""
    from g2rpo.common.families.attention_choice import fastest

    assert fastest({"flash": 2e-3, "efficient": None, "cudnn": 1e-3, "math": 5e-3}) == "cudnn"
    assert fastest({"math": 1e-3, "flash": 1e-3}) == "flash"  # SINGLE_KERNELS's order
    with pytest.raises(RuntimeError, match=r"model\.rollout_attention_backend"):
        fastest({"flash": None, "math": None})


def test_fastest_is_measured_at_the_first_attention_shape_on_cpu():
    """Catches: the kernels timed at a made-up shape; a kernel that does not exist on the
    CPU (efficient, cuDNN) reported as timed; the chosen kernel not the one sampling."""
    from g2rpo.common.families.attention_choice import SINGLE_KERNELS, fastest
    from g2rpo.common.families.flux import FluxVelocity, build_tiny_flux

    model = build_tiny_flux("test", seed=0).requires_grad_(False)
    x, t, cond = torch.randn(3, 4, 64), torch.tensor([0.9, 0.5, 0.3]), flux_cond(3)
    measured = FluxVelocity(model, 4, 4).for_rollout(attention="fastest")
    with torch.inference_mode():
        out = measured(x, t, cond)
    times = measured.attention_times
    assert set(times) == set(SINGLE_KERNELS)
    assert times["efficient"] is None and times["cudnn"] is None  # no such CPU kernels
    assert times["math"] > 0 and times["flash"] > 0  # torch's two CPU kernels
    assert measured.attention_backend == fastest(times) in ("flash", "math")
    # [batch, heads, 4 image + 5 text tokens, head dim]: FLUX's joint attention
    assert measured.attention_shape.query == (3, 2, 9, 16)
    assert measured.calls == 1
    with torch.inference_mode():
        named = FluxVelocity(model, 4, 4, attention_backend=measured.attention_backend)(x, t, cond)
    assert torch.equal(out, named)
    record = measured.attention_record()
    assert record["attention_backend"] == measured.attention_backend
    assert record["attention_ms"]["cudnn"] is None
    assert record["attention_shape"]["query"] == [3, 2, 9, 16]


def test_worker_samples_with_its_rollout_backend_and_the_learner_keeps_its_own():
    """Catches: model.rollout_attention_backend not reaching the worker, or reaching the
    learner (whose backward must keep model.attention_backend)."""
    from g2rpo.common.config.loading import load_config
    from g2rpo.learner.trainer import LearnerCore
    from g2rpo.rollout_worker.worker import RolloutWorkerCore

    small = [
        f"model.pretrained={REPO / 'assets' / 'shapes-world' / 'pipeline'}",
        "sampling.num_steps=4",
        "sampling.sde_steps=[0]",
        "sampling.group_size=2",
        "sampling.prompts_per_worker=1",
        "train.workers.count=1",
    ]

    def cfg(*extra):
        return load_config(REPO / "configs" / "tiny.yaml", [*small, *extra])

    named = RolloutWorkerCore(cfg("model.rollout_attention_backend=math"), 0)
    assert named.model.attention_backend == "math" and named.model.attention_times is None
    worker = RolloutWorkerCore(cfg("model.rollout_attention_backend=fastest"), 0)
    worker.sample(0, ["a red circle on a blue background"])
    record = worker.model.attention_record()
    assert record["attention_backend"] in ("flash", "math") and "attention_ms" in record
    learner = LearnerCore(cfg("model.rollout_attention_backend=math"))
    assert learner.velocity.attention_backend == "auto" and not learner.velocity.measure_attention
    with pytest.raises(ValueError, match="rollout_attention_backend"):
        cfg("model.rollout_attention_backend=fast")
