"""The CUDA memory plan against peaks measured on an H200 (docs/results/gpu-h200-*):
bin/gpu-check's doctor's rollout and learn phases, every call `g2rpo bench plan-memory`
measured, and the VAE decode's CUDA factor (the plan itself: tests/test_plan.py)."""

import json
from pathlib import Path

import pytest
from g2rpo.common.config.loading import load_config
from g2rpo.planning.estimate import GiB, plan
from g2rpo.planning.presets import COMPONENTS, preset_config
from plan_setup import ROOT, SMALL, _actor, module_plan_cache


@pytest.fixture(scope="module", autouse=True)
def _plan_cache(tmp_path_factory):
    """One trace cache for the module (not the user's): each FLUX shape is traced once."""
    yield from module_plan_cache(tmp_path_factory)


# bin/gpu-check's doctor runs on an H200 (2026-11-27): config, overrides, the transformer's
# blocks (--random-weights flux1-dev --blocks 2,4 builds that width; None: full depth)
GPU_RUN = ROOT / "docs" / "results" / "gpu-h200-2026-11-27"
SHAPES = ["train.prompts=shapes:train", "train.eval.prompts=shapes:held_out"]
DOCTOR_RUNS = {
    "doctor_flux_2x4": ("flux_hps", [], (2, 4)),
    "doctor_flux_lora": (
        "flux_hps_lora_8gpu",
        ["sampling.prompts_per_worker=1", "sampling.sde_steps=[6,7]"],
        None,
    ),
    "doctor_nft_2x4": ("nft_flux", ["sampling.prompts_per_worker=1"], (2, 4)),
    "doctor_tree_2x4": ("treegrpo_flux", ["sampling.prompts_per_worker=1"], (2, 4)),
}


def _flux_architecture(directory: Path, blocks: tuple[int, int]) -> Path:
    """FLUX.1-dev's component configs at (double, single) transformer blocks, as
    --random-weights flux1-dev --blocks builds them: the plan reads only config.json."""
    for name in COMPONENTS:
        arch = preset_config("flux1-dev", name)
        if name == "transformer":
            arch.update(num_layers=blocks[0], num_single_layers=blocks[1])
        (directory / name).mkdir()
        (directory / name / "config.json").write_text(json.dumps(arch))
    return directory


def _doctor_phases(folder: Path, run: str) -> dict[str, dict]:
    return {p["phase"]: p for p in json.loads((folder / f"{run}.json").read_text())["phases"]}


@pytest.mark.parametrize("run", sorted(DOCTOR_RUNS))
def test_cuda_plan_holds_the_rollout_peak_measured_on_an_h200(tmp_path, run):
    """The rollout phase's measured peak against today's plan of the same config. Before
    the CUDA factors (planning/estimate.py) the plan was 2.8-10.4% under in all four."""
    config, over, blocks = DOCTOR_RUNS[run]
    if blocks is not None:
        over = [*over, f"model.pretrained={_flux_architecture(tmp_path, blocks)}"]
    cfg = load_config(ROOT / "configs" / f"{config}.yaml", [*SHAPES, *over])
    phases = _doctor_phases(GPU_RUN, run)
    measured = phases["rollout"]["peak_gib"]
    planned = _actor(plan(cfg), "rollout worker").peak / GiB
    # the FLUX-width run's 48-sample call is still 1.9% over the plan (benchmarks.md)
    assert 0.975 * measured <= planned <= 1.05 * measured


ADAMW_RUN = ROOT / "docs" / "results" / "gpu-h200-2026-11-27-adamw"


@pytest.mark.parametrize(
    "run, kernel", [("doctor_flux_2x4_fused", "auto"), ("doctor_flux_2x4_foreach", "foreach")]
)
def test_cuda_learner_plan_holds_the_learn_peak_measured_on_an_h200(tmp_path, run, kernel):
    """flux_hps's one-rank FSDP bf16 learner at FLUX.1-dev's width: the `learn` phase's
    peak against the plan of the same run. Its update batched one state a forward (one
    prompt; the G branches of an SDE step share the anchor's state), so the plan is taken
    at max_batch 1. The fused step's peak is the backward (which held a block's gradients
    being reduced, 0.6 GiB the plan once missed); foreach's is its step scratch (1.04 GiB
    over the plan without it)."""
    arch = _flux_architecture(tmp_path, (2, 4))
    path = ROOT / "configs" / "flux_hps.yaml"
    over = [*SHAPES, f"model.pretrained={arch}", f"optim.implementation={kernel}"]
    # the doctor's learner is a one-rank group
    cfg = load_config(path, [*over, "train.learner.count=1", "train.learner.max_batch=1"])
    phases = _doctor_phases(ADAMW_RUN, run)
    measured = phases["learn"]["peak_gib"]
    planned = _actor(plan(cfg), "learner rank").peak / GiB
    assert 0.995 * measured <= planned <= 1.01 * measured


def test_cuda_factors_hold_every_call_bench_plan_memory_measured():
    """Each call `g2rpo bench plan-memory` ran on the H200, against what today's factors
    make of its trace: at or over the measured peak, by at most 5%."""
    from g2rpo.planning.estimate import sampler_forward_call, vae_decode_call

    rows = json.loads((GPU_RUN / "plan_memory.json").read_text())
    del rows["settings"]
    assert len(rows) == 8
    for name, row in rows.items():
        calls = int(name.rsplit("_", 1)[1])  # images decoded, or the call's batch
        traced = row["traced_gib"] * GiB / calls  # one image's or one sample's
        if name.startswith("vae_decode"):
            planned = vae_decode_call(traced, calls, cuda=True) / GiB
        else:
            planned = sampler_forward_call(traced, calls, 0, cuda=True) / GiB
        assert row["measured_gib"] <= planned <= 1.05 * row["measured_gib"], name


def test_vae_decode_call_on_cuda_and_elsewhere():
    from g2rpo.planning.estimate import vae_decode_call

    assert vae_decode_call(1000, 4, cuda=False) == 4000
    # FLUX.1-dev's VAE at 720² on the H200: 1.483 GiB traced per image; 7.913 GiB measured
    assert vae_decode_call(int(1.483 * GiB), 4, cuda=True) / GiB == pytest.approx(7.994, abs=1e-3)
    cpu = load_config(None, SMALL)
    gpus = [f"train.{k}.num_gpus=1" for k in ("workers", "learner", "eval")]
    gpu = load_config(None, [*SMALL, "model.device=cuda", *gpus])
    assert _actor(plan(gpu), "rollout worker").peak > _actor(plan(cpu), "rollout worker").peak
