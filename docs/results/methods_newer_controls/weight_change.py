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
        runs/compare/methods g2rpo,control,awm,awm_control
"""

import itertools
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

WEIGHTS = "transformer/diffusion_pytorch_model.safetensors"


def move(weights: dict, base: dict) -> torch.Tensor:
    """θ − θ₀ over the base's tensors, flattened in name order (float64)."""
    return torch.cat([(weights[k].double() - base[k].double()).flatten() for k in sorted(base)])


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


def main(root: Path, methods: list[str], base_dir: Path) -> None:
    base = load_file(base_dir / WEIGHTS)
    size = torch.cat([v.double().flatten() for _, v in sorted(base.items())]).norm()
    print("| method | runs | ‖θ − θ₀‖ / ‖θ₀‖, mean [min, max] | cosine between seeds' moves |")
    print("|---|---|---|---|")
    for method in methods:
        files = [root / "runs" / f"{method}-s{seed}" / "final" / WEIGHTS for seed in range(100)]
        moves = [move(load_file(f), base) for f in files if f.is_file()]
        if not moves:
            continue
        change = [float(m.norm() / size) for m in moves]
        pairs = [cosine(a, b) for a, b in itertools.combinations(moves, 2)]
        agreement = f"{sum(pairs) / len(pairs):+.3f}" if pairs else "–"
        mean = f"{sum(change) / len(change):.4f} [{min(change):.4f}, {max(change):.4f}]"
        print(f"| {method} | {len(moves)} | {mean} | {agreement} |")


if __name__ == "__main__":
    base_dir = Path(sys.argv[3]) if len(sys.argv) > 3 else Path("assets/shapes-world/pipeline")
    main(Path(sys.argv[1]), sys.argv[2].split(","), base_dir)
