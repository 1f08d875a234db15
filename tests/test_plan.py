"""The memory plan: FLUX.1-dev presets, estimates held against traced peaks, the CLI (the CUDA
plan against peaks measured on an H200: tests/test_plan_h200.py)."""

from __future__ import annotations

import pytest
import torch
from g2rpo.planning.presets import COMPONENTS, PRESETS, build_component, preset_config

# Parameter counts of FLUX.1-dev's components (the published checkpoints' sizes).
FLUX1_DEV_PARAMS = {
    "transformer": 11.90e9,
    "text_encoder_2": 4.76e9,
    "text_encoder": 123.1e6,
    "vae": 83.8e6,
}


# SD3.5-Medium: the transformer's 2.24B parameters and its 226M-number positional table
# (a buffer, saved with the weights) are the 2.47B of its 4.94 GB bf16 file; CLIP-G is
# OpenCLIP bigG's 695M text tower, CLIP-L with its projection 123.7M, T5-XXL's encoder
SD35_MEDIUM_PARAMS = {
    "transformer": 2.2432e9,
    "vae": 83.8e6,
    "text_encoder": 123.65e6,
    "text_encoder_2": 694.66e6,
    "text_encoder_3": 4.76e9,
}


@pytest.mark.parametrize("component", list(SD35_MEDIUM_PARAMS))
def test_sd35_medium_preset_builds_with_published_size(component):
    with torch.device("meta"):
        module = build_component(component, preset_config("sd35-medium", component))
    params = sum(p.numel() for p in module.parameters())
    assert params == pytest.approx(SD35_MEDIUM_PARAMS[component], rel=0.005)
    if component == "transformer":
        weights = params + sum(b.numel() for b in module.buffers())
        assert weights == pytest.approx(4.94e9 / 2, rel=0.005)
        assert type(module).__name__ == "SD3Transformer2DModel"


@pytest.mark.parametrize("component", COMPONENTS)
def test_flux1_dev_preset_builds_with_published_size(component):
    assert PRESETS == ("flux1-dev", "sd35-medium", "qwen-image")
    with torch.device("meta"):
        module = build_component(component, preset_config("flux1-dev", component))
    params = sum(p.numel() for p in module.parameters())
    assert params == pytest.approx(FLUX1_DEV_PARAMS[component], rel=0.005)


def test_preset_errors_name_the_choices():
    with pytest.raises(ValueError, match="flux1-dev"):
        preset_config("flux2", "vae")
    with pytest.raises(ValueError, match="text_encoder_2"):
        preset_config("flux1-dev", "unet")


# ---------------------------------------------------------------- the plan

import json  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

from g2rpo.cli import main  # noqa: E402
from g2rpo.common.config.loading import load_config  # noqa: E402
from g2rpo.common.errors import ConfigError  # noqa: E402
from g2rpo.planning.check import refuse_misfit  # noqa: E402
from g2rpo.planning.estimate import GiB, plan  # noqa: E402
from plan_setup import ROOT, SMALL, _actor, module_plan_cache  # noqa: E402

PROMPTS = ["a red circle on a blue background", "a green square on a white background"]


@pytest.fixture(scope="module", autouse=True)
def _plan_cache(tmp_path_factory):
    """One trace cache for the module (not the user's): each FLUX shape is traced once."""
    yield from module_plan_cache(tmp_path_factory)


# the paper's recipe as the official script trains it: one full fine-tune on one GPU
ONE_LEARNER = [
    "train.learner.count=1",
    "model.mixed_precision=autocast",
    "model.rollout_weights_dtype=float32",
    "model.gradient_checkpointing=false",
]


def test_one_learner_full_flux_fine_tune_does_not_fit_80gb_and_says_why():
    cfg = load_config(ROOT / "configs" / "flux_hps.yaml", ONE_LEARNER)
    learner = _actor(plan(cfg, 80), "learner rank")
    assert not learner.fits
    parts = {k.split(" ")[0]: v / GiB for k, v in learner.parts.items()}
    # 11.9B parameters: fp32 weights 44 GiB + gradients 44 GiB + AdamW 89 GiB
    assert parts["weights"] == pytest.approx(44.34, abs=0.05)
    assert parts["gradients"] == pytest.approx(44.34, abs=0.05)
    assert parts["AdamW"] == pytest.approx(88.67, abs=0.1)
    with pytest.raises(ConfigError, match=r"learner rank .*weights.*"):
        refuse_misfit(cfg)
    fixed = load_config(
        ROOT / "configs" / "flux_hps.yaml",
        [
            *ONE_LEARNER,
            "train.learner.count=16",
            "model.gradient_checkpointing=true",
            "model.mixed_precision=fsdp",
            "train.learner.max_batch=1",
        ],
    )
    assert _actor(plan(fixed, 80), "learner rank").fits


def _traced_peak(fn, *modules, grads: bool = True) -> int:
    from g2rpo.planning.trace import ActivationPeakTracker  # MemTracker, frozen weights too

    tracker = ActivationPeakTracker(grads=grads)
    tracker.track_external(*modules)
    with tracker:
        fn()
    return max(s["Total"] for s in tracker.get_tracker_snapshot("peak").values())


def test_rollout_worker_estimate_within_10_percent_of_the_traced_sample():
    from g2rpo.rollout_worker.worker import RolloutWorkerCore

    cfg = load_config(None, [*SMALL, "sampling.max_batch=16", "sampling.decode_batch=16"])
    core = RolloutWorkerCore(cfg, 0)
    c = core.comps
    with torch.no_grad():
        c.transformer.requires_grad_(False)
        traced = _traced_peak(
            lambda: core.sample(0, PROMPTS),
            c.transformer,
            c.vae,
            c.text_encoder,
            c.text_encoder_2,
            grads=False,
        )
    estimate = _actor(plan(cfg), "rollout worker").peak
    assert estimate == pytest.approx(traced, rel=0.10)


def _traced_second_update(cfg) -> int:
    """The traced peak of a learner's second update on one rollout of PROMPTS (AdamW's
    states exist from the first on: the plan's steady state)."""
    from g2rpo.learner.trainer import LearnerCore
    from g2rpo.rollout_worker.worker import RolloutWorkerCore

    worker = RolloutWorkerCore(cfg, 0)
    plan_, cond, result, _ = worker.sample(0, PROMPTS)
    rewards = {"shapes_clip": torch.rand(len(plan_.leaves))}
    batch = worker.trajectories(0, PROMPTS, plan_, cond, result, rewards)
    core = LearnerCore(cfg)
    core.update([batch])

    def update():
        batch.version = core.version
        core.update([batch])

    return _traced_peak(update, core.transformer, core.optimizer)


def test_learner_estimate_within_10_percent_of_the_traced_update():
    # several micro-batches per optimizer step: the plan's steady state
    cfg = load_config(None, [*SMALL, "train.learner.max_batch=2", "optim.step_mode=accumulate"])
    traced = _traced_second_update(cfg)
    estimate = _actor(plan(cfg), "learner rank").peak
    assert estimate == pytest.approx(traced, rel=0.10)


def test_learner_plan_counts_adamw_foreach_scratch_where_it_outgrows_the_backward():
    """torch's foreach AdamW (its CUDA default) holds a float32 scratch the size of the
    trained weights in its step, after the backward has freed the activations: with one
    state a micro-batch it is the update's peak. Traced, the plan is within 3% with the
    scratch term and 7% under without it (an H200 full fine-tune: docs/benchmarks.md)."""
    over = [*SMALL, "train.learner.max_batch=1", "optim.step_mode=accumulate"]
    cfg = load_config(None, [*over, "optim.implementation=foreach"])
    traced = _traced_second_update(cfg)
    learner = _actor(plan(cfg), "learner rank")
    scratch = [v for k, v in learner.parts.items() if k.startswith("AdamW foreach scratch")]
    assert len(scratch) == 1
    assert learner.peak == pytest.approx(traced, rel=0.03)
    assert learner.peak - scratch[0] < 0.95 * traced
    # the default kernel on the CPU (and fused, auto's on CUDA) holds no such scratch
    default = _actor(plan(load_config(None, over)), "learner rank")
    assert default.peak == learner.peak - scratch[0]


def test_cli_table_json_and_exit_codes(capsys):
    tiny = str(ROOT / "configs" / "tiny.yaml")
    assert main(["plan", tiny]) == 0  # a CPU run: nothing to check against a GPU
    assert "rollout worker" in capsys.readouterr().out
    flux = str(ROOT / "configs" / "flux_hps.yaml")
    assert main(["plan", flux, "--json"]) == 0  # the recipe as shipped fits its 80 GiB GPUs
    # 16 workers, 8 learner ranks, 2 replicas at 0.5 (the evaluation is on the workers)
    assert json.loads(capsys.readouterr().out)["gpus_asked"] == 16 + 8 + 2 * 0.5
    one = [a for x in ONE_LEARNER for a in ("--set", x)]
    assert main(["plan", flux, *one, "--json", "--gpu-memory", "80GiB"]) == 3
    rep = json.loads(capsys.readouterr().out)
    learner = next(a for a in rep["actors"] if a["actor"] == "learner rank")
    assert not learner["fits"] and learner["remedies"]
    assert rep["gpus_asked"] == 16 + 1 + 2 * 0.5
    from g2rpo.planning.doctor_fields import is_config_field

    for remedy in learner["remedies"]:  # each --set names a real field and loads
        for change in remedy["set"]:
            assert is_config_field(change.split("=", 1)[0]), change
        load_config(flux, [*ONE_LEARNER, *remedy["set"]])
    assert any("train.learner.count=" in c for r in learner["remedies"] for c in r["set"])
    assert main(["plan", flux, "--gpu-memory", "lots"]) == 2
    assert "--gpu-memory" in capsys.readouterr().err


def header_hardware(path: Path) -> tuple[int, float] | None:
    """``# hardware: 16 x 80GiB GPUs`` in a recipe's header: (GPUs, GiB each)."""
    m = re.search(r"^# hardware: (\d+) x (\d+(?:\.\d+)?)GiB GPUs", path.read_text(), re.M)
    return (int(m.group(1)), float(m.group(2))) if m else None


def assert_fits_its_hardware(path: Path) -> None:
    """What every shipped FLUX recipe must pass once the recipes are complete."""
    hardware = header_hardware(path)
    assert hardware is not None, f"{path.name}: no '# hardware: N x MGiB GPUs' header line"
    gpus, gib = hardware
    p = plan(load_config(path), gib)
    assert p.gpus_asked <= gpus, f"{path.name} asks Ray for {p.gpus_asked} GPUs"
    assert p.fits, [(a.actor, round(a.peak / GiB, 1)) for a in p.actors if not a.fits]


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_is_planned(path):
    p = plan(load_config(path))
    assert p.actors and all(a.peak > 0 for a in p.actors if a.actor != "reward replica")
    if "flux" in path.name or "sd35" in path.name:  # a GPU recipe fits its header's hardware
        assert_fits_its_hardware(path)
    else:  # the CPU world: nothing on a GPU to check
        assert p.fits


# ---------------------------------------------------------------- shipped traces


def _fresh_trace_env(monkeypatch, tmp_path, shipped: bool):
    """An empty trace cache, the shipped table on or off, nothing planned yet."""
    from g2rpo.planning import estimate, trace

    monkeypatch.setenv("G2RPO_PLAN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("G2RPO_PLAN_SHIPPED", "1" if shipped else "0")
    trace.shipped_traces.cache_clear()
    estimate._plan_cached.cache_clear()


def test_the_shipped_table_answers_readme_and_every_flux_recipe_without_tracing(
    monkeypatch, tmp_path
):
    """Every plan ship_traces lists (each shipped FLUX recipe, README's one-GPU
    learner, at 80 and 141 GiB, remedies included, and the FLOP counts of its time
    estimate) is answered with nothing traced and nothing built: a missing entry would
    reach the tracer, which raises here."""
    from g2rpo.planning import components, estimate, trace
    from g2rpo.planning.calibration import calibration
    from g2rpo.planning.check import report
    from g2rpo.planning.ship_traces import shipped_plans
    from g2rpo.planning.timing import estimate_time

    def no_tracing(*_a, **_k):
        raise AssertionError("traced: the shipped table lacks this shape (ship_traces)")

    _fresh_trace_env(monkeypatch, tmp_path, shipped=True)
    monkeypatch.setattr(trace, "_fake_mode", no_tracing)
    monkeypatch.setattr(components, "_build_meta", no_tracing)
    plans = shipped_plans()
    assert {p.name for p, _, _ in plans} >= {"flux_hps.yaml", "flux_hps_lora_8gpu.yaml"}
    try:
        for path, over, gib in plans:
            cfg = load_config(path, over)
            rep = report(cfg, gib)
            assert rep["actors"], path
            assert estimate_time(cfg, calibration("H200")).iteration_s > 0  # its FLOPs too
    finally:
        trace.shipped_traces.cache_clear()
        estimate._plan_cached.cache_clear()
    assert not (tmp_path / "cache").exists()  # nothing was traced, so nothing cached


def test_a_shipped_trace_equals_a_fresh_trace(monkeypatch, tmp_path):
    """The table is what the tracer measures today: the rollout (no-grad) transformer
    call and the VAE decode traced again on fake tensors give the shipped bytes."""
    from g2rpo.planning import estimate, trace

    shipped = trace.shipped_traces()
    entries = [json.loads(k) | {"result": r} for k, r in shipped.items()]
    rollout = next(e for e in entries if e["kind"] == "transformer" and not e["train"])
    vae = next(e for e in entries if e["kind"] == "vae")
    _fresh_trace_env(monkeypatch, tmp_path, shipped=False)
    try:
        shape = {k: rollout[k] for k in rollout if k not in ("kind", "v", "arch", "result")}
        shape["latent_hw"] = tuple(shape["latent_hw"])
        assert trace.transformer_activations(rollout["arch"], **shape) == rollout["result"]
        fresh = trace.vae_decode_activations(vae["arch"], tuple(vae["latent_hw"]))
        assert fresh == vae["result"]["bytes"]
    finally:
        trace.shipped_traces.cache_clear()
        estimate._plan_cached.cache_clear()


def test_colocated_pairs_are_planned_phase_by_phase():
    """configs/flux_hps_8gpu.yaml (train.placement colocated): the rollout phase has the
    whole GPU (the learner rank waits on the host) less the reward replica in the pair
    (train.reward.in_pairs); the learn phase has it less what the worker keeps there (its
    text encoders and VAE) and the replica. One GPU per pair, not a share each."""
    from g2rpo.planning.check import report
    from g2rpo.planning.pairs import WORKER_RESIDUE

    rep = report(load_config(ROOT / "configs" / "flux_hps_8gpu.yaml"), 80)
    worker, learner, replica = (
        next(a for a in rep["actors"] if a["actor"] == n) for n in (*_PAIR, "reward replica")
    )
    residue = sum(v for k, v in worker["parts_gib"].items() if k.startswith(WORKER_RESIDUE))
    assert 9 < residue < 10  # T5-XXL and CLIP in bf16, the VAE in float32
    # HPS-v2.1's ViT-H and the held-out DFN5B CLIP's (issue 57) in bf16, and a scoring batch
    scorer = replica["peak_gib"]
    assert 4.6 < scorer < 4.7
    assert worker["budget_gib"] == pytest.approx(80 - scorer, abs=0.02)
    assert learner["budget_gib"] == pytest.approx(80 - residue - scorer, abs=0.02)
    assert rep["fits"] and rep["gpus_asked"] == 8  # 8 pairs, the replicas inside two
    # the same pair apart, each on its half of a GPU: the worker no longer fits
    apart = report(
        load_config(
            ROOT / "configs" / "flux_hps_8gpu.yaml",
            ["train.placement=disaggregated", "train.reward.in_pairs=false"],
        ),
        80,
    )
    assert not next(a for a in apart["actors"] if a["actor"] == "rollout worker")["fits"]


_PAIR = ("rollout worker", "learner rank")
