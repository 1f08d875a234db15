"""`g2rpo plan`'s time estimate: FLOPs counted on fake tensors (attention included on a
CPU), the calibration table's rules, the phases of shipped recipes, and `--gpus N`'s
layout search."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from g2rpo.common.algorithms.flops import count_flops
from g2rpo.common.config.loading import load_config
from g2rpo.planning.calibration import Calibration, Rate, calibration, read_rates
from g2rpo.planning.flop_trace import transformer_flops
from g2rpo.planning.presets import preset_config
from g2rpo.planning.timing import estimate_time

REPO = Path(__file__).resolve().parents[1]


def test_cpu_attention_is_counted():
    # QKᵀ and AV: 2 matmuls of 2·b·h·s·s·d FLOPs each. torch's counter knew only the CUDA
    # kernels, so a CPU count (and every fake-tensor count) left attention out: 0 here.
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    fn = torch.nn.functional.scaled_dot_product_attention
    assert count_flops(lambda: fn(q, k, v)) == 4 * 1 * 2 * 16 * 16 * 8
    qg = q.clone().requires_grad_()
    assert count_flops(lambda: fn(qg, k, v).sum().backward()) == 4 * 2 * 16 * 16 * 8 * 3.5


def test_flux_dev_forward_flops_agree_with_the_h200_count():
    # the doctor counted 37,661,096,128,512 FLOPs per NFE on the H200 (CUDA kernels, real
    # tensors; docs/results/gpu-h200-2026-11-27/doctor_flux_lora.json); the plan counts
    # on fake CPU tensors at three small depths and solves for 19 + 38 blocks
    flops = transformer_flops(preset_config("flux1-dev", "transformer"), (90, 90), 512)
    assert flops == pytest.approx(37_661_096_128_512, rel=0.02)


def test_depth_extrapolation_is_exact():
    arch = {**preset_config("flux1-dev", "transformer"), "num_attention_heads": 2}
    arch.update(attention_head_dim=16, axes_dims_rope=[4, 6, 6], joint_attention_dim=32)
    arch.update(pooled_projection_dim=16, num_layers=3, num_single_layers=2)
    solved = transformer_flops(arch, (8, 8), 7)
    from g2rpo.planning.flop_trace import _transformer_once

    assert solved == _transformer_once(arch, {"num_layers": 3, "num_single_layers": 2}, (8, 8), 7)


def rate(q, v, source="measured", device="NVIDIA H200"):
    return Rate(device=device, quantity=q, value=v, source=source, setting="test")


def test_calibration_rules(tmp_path):
    rows = [
        rate("sample_tflops", 300),
        rate("sample_tflops", 360),
        rate("sample_tflops", 400),
        rate("sample_tflops", 1000, "assumed"),  # a measured row outranks an assumed one
        rate("host_copy_gbps", 10, "assumed"),
    ]
    h200 = Calibration("H200", rows).rate("sample_tflops")
    assert (h200.value, h200.basis, h200.rows) == (360, "measured", 3)  # the median
    # an uncalibrated GPU: H200's compute scaled by the bf16 peaks, transfers as they are
    l40s = Calibration("NVIDIA L40S", rows)
    assert l40s.rate("sample_tflops").value == pytest.approx(360 * 362.1 / 989.4)
    assert l40s.rate("sample_tflops").basis == "scaled"
    assert l40s.rate("host_copy_gbps").value == 10
    with pytest.raises(KeyError, match="decode_tflops for 'cpu'"):
        Calibration("cpu", rows).rate("decode_tflops")  # a CPU never borrows a GPU's
    bad = tmp_path / "cal.jsonl"
    bad.write_text(rates_line() + '{"device": "cpu", "quantity": "nfe_per_s", "value": 1}\n')
    with pytest.raises(ValueError, match=r"cal.jsonl:2: not a calibration row"):
        read_rates(bad)


def rates_line() -> str:
    return rate("learn_tflops", 1.0, device="cpu").model_dump_json() + "\n"


def test_shipped_recipes_are_timed_phase_by_phase():
    cal = calibration("H200")
    eight = estimate_time(load_config(REPO / "configs/flux_hps_8gpu.yaml"), cal)
    sixteen = estimate_time(load_config(REPO / "configs/flux_hps_16gpu.yaml"), cal)
    for tm, link in ((eight, "nvlink_gbps"), (sixteen, "ib_gbps")):
        assert set(tm.phases) >= {"publish", "rollout", "reward", "learn", "checkpoint"}
        assert tm.iteration_s == pytest.approx(sum(tm.phases.values()))
        assert tm.gpu_hours == pytest.approx(tm.iteration_s * 301 * tm.gpus / 3600)
        used = {r.quantity: r for r in tm.rates}
        assert used["sample_tflops"].basis == "measured"
        # said, not hidden: the learner group's link (one node, or two over InfiniBand)
        assert used[link].basis == "assumed"
    assert (eight.gpus, sixteen.gpus) == (8, 16)
    # 16 prompts on 8 pairs (2 each) vs 15 on 15 pairs (1 each): the learner's share of
    # the states is smaller on 15 ranks
    assert sixteen.phases["learn"] < eight.phases["learn"]
    # the rollout is 3,104 NFEs of 37.3 TFLOP at the H200's measured ~365 TFLOP/s
    nfe = 3104 * 37.28e12 / (cal.rate("sample_tflops").value * 1e12)
    assert eight.phases["rollout"] == pytest.approx(nfe, rel=0.15)


def plan_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "g2rpo.cli", "plan", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_plan_prints_hours_and_picks_a_layout_for_8_gpus():
    proc = plan_cli("configs/flux_hps_8gpu.yaml", "--gpu-memory", "80GiB", "--gpus", "8", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads(proc.stdout)
    assert rep["fits"] and rep["time"]["iteration_s"] > 0 and rep["time"]["gpu_hours"] > 0
    best = next(x for x in rep["layouts"] if x["fits"])
    # on 8 GPUs the recipe's own layout is the fastest that fits: 8 colocated pairs, the
    # reward replicas inside two of them, no GPU idle
    assert (
        "train.placement=colocated" in best["sets"] and "train.reward.in_pairs=true" in best["sets"]
    )
    assert "train.workers.count=8" in best["sets"] and best["gpus"] == 8 and best["idle"] == 0
    assert best["iteration_s"] == pytest.approx(rep["time"]["iteration_s"], rel=1e-4)
    # every candidate that fits asks for at most 8 GPUs
    assert all(x["gpus"] <= 8 for x in rep["layouts"] if x["fits"])


def test_benchmarks_recipe_figures_are_the_plans():
    """docs/benchmarks.md's "What it says about the recipes": each figure is what `g2rpo
    plan` prints today (issue 58: it gave 1,264 s for the best disaggregated 8-GPU layout
    where the plan printed 1,303 s)."""
    text = (REPO / "docs" / "benchmarks.md").read_text()
    block = text.split("**What it says about the recipes**")[1].split("\n## ")[0]
    block = " ".join(block.split())  # the figures, whatever the line breaks
    cal = calibration("H200")
    timed = {
        name: estimate_time(load_config(REPO / "configs" / f"{name}.yaml"), cal)
        for name in ("flux_hps_8gpu", "flux_hps_16gpu", "flux_hps", "nft_flux")
    }
    eight = timed["flux_hps_8gpu"]
    assert (
        f"`flux_hps_8gpu`: {eight.iteration_s:,.0f} s an iteration; {eight.run_hours:,.0f} h "
        f"and {eight.gpu_hours:,.0f} GPU-hours for 301 iterations. Its rollout is "
        f"{eight.phases['rollout']:,.0f} s" in block
    ), block
    for name, gpus in (("flux_hps_16gpu", ""), ("flux_hps", " (25 GPUs)")):
        tm = timed[name]
        said = f"`{name}`{gpus}: {tm.iteration_s:,.0f} s, {tm.run_hours:,.0f} h, "
        assert said + f"{tm.gpu_hours:,.0f} GPU-hours" in block, (said, block)
    nft = timed["nft_flux"]
    said = f"plans {nft.phases['learn']:,.0f} of {nft.iteration_s:,.0f} s in the learn phase"
    assert said in block, (said, block)
    proc = plan_cli("configs/flux_hps_8gpu.yaml", "--gpu-memory", "80GiB", "--gpus", "8", "--json")
    layouts = json.loads(proc.stdout)["layouts"]
    fit = [x for x in layouts if x["fits"]]
    assert f"searched {len(layouts)} layouts" in block and f"({len(fit)} fit)" in block, block
    apart = min(
        (x for x in fit if "train.placement=disaggregated" in x["sets"]),
        key=lambda x: x["iteration_s"],
    )
    sets = dict(s.split("=", 1) for s in apart["sets"])
    shape = (
        f"({sets['train.workers.count']} workers of {sets['sampling.prompts_per_worker']} "
        f"prompts, {sets['train.learner.count']} ranks) plans at {apart['iteration_s']:,.0f} s"
    )
    assert shape in block, (shape, block)


def test_readme_hours_are_the_plans():
    """README's recipe tables give each FLUX, SD3.5 and Qwen-Image recipe's seconds per
    iteration and hours: they must be what `g2rpo plan` says today."""
    text = (REPO / "README.md").read_text()
    recipe = ("flux", "sd35", "qwenimage")
    rows = [
        x
        for x in text.splitlines()
        if x.startswith("| `") and any(r in x.split("|")[1] for r in recipe)
    ]
    seen = 0
    cal = calibration("H200")
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        name = cells[0].strip("`")
        if len(cells) != 8 or not (REPO / "configs" / name).is_file():
            continue
        tm = estimate_time(load_config(REPO / "configs" / name), cal)
        assert cells[6] == f"{tm.iteration_s:.0f}", name
        assert cells[7] == f"{tm.run_hours:.0f} ({tm.gpu_hours:,.0f})", name
        seen += 1
    assert seen == sum(len(list((REPO / "configs").glob(f"*{r}*.yaml"))) for r in recipe)
