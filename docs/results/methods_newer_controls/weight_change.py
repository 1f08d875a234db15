"""How far, and how consistently, each method of a comparison moved the transformer's
weights from the base. Per method, over its finished runs (seeds):

- change: ‖θ − θ₀‖ / ‖θ₀‖ over every parameter, mean [min, max] over seeds;
- agreement: the mean cosine between two seeds' moves θ − θ₀ over every pair of seeds.
  If each seed's move is a shared direction u plus its own noise n (independent, of equal
  size), the expected cosine is ‖u‖² / (‖u‖² + ‖n‖²): 0 for a random walk, 1 when every
  seed moves the same way.

A diagnostic beside the reward tables (docs/results.md, "Every newer method beside its
control"), not a reward.

    .venv/bin/python docs/results/methods_newer_controls/weight_change.py \
        configs/compare/methods.yaml g2rpo,control,awm,awm_control

The runs and the base are the spec's (``plan_runs``); runs not finished are left out.
"""

import itertools
import sys
from pathlib import Path

import torch
from g2rpo.common.paths import resolve_path
from g2rpo.evaluation.compare_spec import load_spec, plan_runs
from g2rpo.run_directory.files import finished
from safetensors.torch import load_file

WEIGHTS = "transformer/diffusion_pytorch_model.safetensors"


def move(weights: dict, base: dict) -> torch.Tensor:
    """θ − θ₀ over the base's tensors, flattened in name order (float64)."""
    return torch.cat([(weights[k].double() - base[k].double()).flatten() for k in sorted(base)])


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


def finished_runs(spec_path: Path, methods: list[str]) -> tuple[list, dict]:
    """The spec's finished runs of ``methods`` (in plan order) and the base's transformer
    weights; exits naming a method the spec does not have."""
    spec = load_spec(spec_path)
    unknown = [m for m in methods if m not in spec.methods]
    if unknown:
        sys.exit(f"methods {unknown} are not in {spec_path} (it has {list(spec.methods)})")
    planned = plan_runs(spec)
    base = load_file(resolve_path(planned[0].config.model.pretrained) / WEIGHTS)
    return [r for r in planned if r.method in methods and finished(r.run_dir)], base


def main(spec_path: Path, methods: list[str]) -> None:
    runs, base = finished_runs(spec_path, methods)
    size = torch.cat([v.double().flatten() for _, v in sorted(base.items())]).norm()
    print("| method | runs | ‖θ − θ₀‖ / ‖θ₀‖, mean [min, max] | cosine between seeds' moves |")
    print("|---|---|---|---|")
    for method in methods:
        done = [r.run_dir for r in runs if r.method == method]
        moves = [move(load_file(d / "final" / WEIGHTS), base) for d in done]
        if not moves:
            continue
        change = [float(m.norm() / size) for m in moves]
        pairs = [cosine(a, b) for a, b in itertools.combinations(moves, 2)]
        agreement = f"{sum(pairs) / len(pairs):+.3f}" if pairs else "–"
        mean = f"{sum(change) / len(change):.4f} [{min(change):.4f}, {max(change):.4f}]"
        print(f"| {method} | {len(moves)} | {mean} | {agreement} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2].split(","))
