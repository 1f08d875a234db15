"""Which layers carry a run's change in reward: each finished run's final transformer with
one group of layers put back to the base's weights, sampled and scored on the held-out
split exactly as `g2rpo compare` evaluates (fixed noise, 40 prompts x 8 samples).

Per method and layer group, over seeds (mean [95% t-CI]):

- share: the group's part of the move, ‖Δθ_group‖² / ‖Δθ‖²;
- reverted − run: the held-out `shapes_clip` change when that group alone goes back to the
  base, paired per seed. For a control that fell below the base, a positive value is damage
  the group carried; for a method that gained, a negative value is gain the group carried;
- undone: that change as a fraction of (base − run), the run's whole change undone;
- random move: the base moved, tensor by tensor, as far as the run moved it but in a random
  Gaussian direction (seeded by the run's seed), against the run itself.

Groups: embed (x, context and time/text embedders), adaln (every norm*.linear: the
adaptive-norm modulation), attn (every attention projection and q/k norm), mlp (feed-forward
layers, and the single blocks' proj_out, which mixes attention and MLP outputs), out (the
final proj_out). They cover every tensor once.

A diagnostic beside the reward tables (docs/results.md, "Every newer method beside its
control"), not a package feature.

    .venv/bin/python docs/results/methods_newer_controls/layer_revert.py \
        configs/compare/methods.yaml control,awm_control [out.json [variants]]

variants: which of none, the groups and random to measure (default all; e.g. none,random).
Per-run scores go to out.json (default /tmp/layer_revert.json) as they are measured, so a
second call reuses them.
"""

import json
import re
import sys
from pathlib import Path

import torch
from g2rpo.common.algorithms.stats import seed_summary
from g2rpo.evaluation.evaluate import EvalSettings, evaluate_policy
from g2rpo.evaluation.metrics import make_scorers
from g2rpo.evaluation.policy import load_policy, resolve_policy
from safetensors.torch import load_file
from weight_change import WEIGHTS, finished_runs  # the script beside this one

GROUPS = {
    "embed": r"^(x_embedder|context_embedder|time_text_embed)\.",
    "adaln": r"(^|\.)norm[^.]*\.linear\.",
    "attn": r"\.attn\.",
    "mlp": r"\.(ff|ff_context)\.|\.proj_mlp\.|^single_transformer_blocks\.\d+\.proj_out\.",
    "out": r"^proj_out\.",
}


def group_of(name: str) -> str:
    hits = [g for g, pattern in GROUPS.items() if re.search(pattern, name)]
    if len(hits) != 1:
        raise ValueError(f"tensor {name!r} is in groups {hits}: each must be in exactly one")
    return hits[0]


def reverted(weights: dict, base: dict, group: str | None) -> dict:
    """The run's weights with ``group``'s tensors back at the base's (None: unchanged)."""
    return {k: base[k] if group_of(k) == group else v for k, v in weights.items()}


def random_move(weights: dict, base: dict, seed: int) -> dict:
    """The base plus, in every tensor, a Gaussian direction scaled to the run's own move in
    that tensor: a move of the run's size and layout whose direction owes nothing to any
    reward or to training."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for k in sorted(base):
        b = base[k].double()
        d = torch.randn(b.shape, generator=gen, dtype=torch.float64)
        size = (weights[k].double() - b).norm()
        out[k] = (b + d * (size / d.norm().clamp_min(1e-30))).to(base[k].dtype)
    return out


def variant(name: str, weights: dict, base: dict, seed: int) -> dict:
    if name == "none":
        return weights
    if name == "random":
        return random_move(weights, base, seed)
    return reverted(weights, base, name)


def move_share(weights: dict, base: dict) -> dict[str, float]:
    sq = dict.fromkeys(GROUPS, 0.0)
    for k, b in base.items():
        sq[group_of(k)] += float((weights[k].double() - b.double()).pow(2).sum())
    total = sum(sq.values())
    return {g: v / total for g, v in sq.items()}


def held_out_clip(comps, settings, scorers, weights: dict) -> float:
    comps.transformer.load_state_dict(weights)
    split = evaluate_policy(comps, settings, scorers)["held_out"]
    return float(split.values["shapes_clip"].mean())


def measure(spec_path: Path, methods: list[str], cache: Path, variants: list[str]) -> dict:
    runs, base = finished_runs(spec_path, methods)
    done = json.loads(cache.read_text()) if cache.exists() else {}
    comps = load_policy(resolve_policy(runs[0].run_dir))
    settings = EvalSettings.for_run(runs[0].config, splits=["held_out"])
    scorers = make_scorers(settings.scorers, settings.device)
    if "base" not in done:
        done["base"] = held_out_clip(comps, settings, scorers, base)
    for run in runs:
        row = done.setdefault(run.name, {"method": run.method, "seed": run.seed})
        weights = load_file(run.run_dir / "final" / WEIGHTS)
        row["share"] = move_share(weights, base)
        for group in variants:
            if group not in row:
                row[group] = held_out_clip(
                    comps, settings, scorers, variant(group, weights, base, run.seed)
                )
                cache.write_text(json.dumps(done, indent=1))
                print(f"{run.name} {group} {row[group]:.4f}", file=sys.stderr, flush=True)
    return done


def table(done: dict, methods: list[str]) -> str:
    def fmt(iv, d=3):
        return f"{iv['mean']:+.{d}f} [{iv['lo']:+.{d}f}, {iv['hi']:+.{d}f}]".replace("-", "−")

    lines = [
        f"Base held-out `shapes_clip`: {done['base']:.4f}.",
        "",
        "| method | seeds | run − base | group | share of ‖Δθ‖² | reverted − run | undone |",
        "|---|---|---|---|---|---|---|",
    ]
    for method in methods:
        rows = [r for k, r in done.items() if k != "base" and r["method"] == method]
        if not rows or not all(g in r for r in rows for g in GROUPS):
            continue
        change = [r["none"] - done["base"] for r in rows]
        for i, group in enumerate(GROUPS):
            share = seed_summary([r["share"][group] for r in rows])
            back = seed_summary([r[group] - r["none"] for r in rows], paired=True)
            undone = seed_summary(
                [(r[group] - r["none"]) / -c for r, c in zip(rows, change, strict=True)]
            )
            head = (
                f"| {method} | {len(rows)} | {fmt(seed_summary(change))} " if i == 0 else "| | | "
            )
            lines.append(
                f"{head}| {group} | {share['mean']:.2f} | {fmt(back)} | {fmt(undone, 2)} |"
            )
    lines += [
        "",
        "| method | seeds | run − base | random move, run's size − base | run − random move |",
        "|---|---|---|---|---|",
    ]
    for method in methods:
        rows = [r for k, r in done.items() if k != "base" and r["method"] == method]
        if rows and all("random" in r for r in rows):
            run = seed_summary([r["none"] - done["base"] for r in rows])
            rand = seed_summary([r["random"] - done["base"] for r in rows])
            diff = seed_summary([r["none"] - r["random"] for r in rows], paired=True)
            lines.append(f"| {method} | {len(rows)} | {fmt(run)} | {fmt(rand)} | {fmt(diff)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    chosen = sys.argv[2].split(",")
    out = Path(sys.argv[3]) if len(sys.argv) > 3 else Path("/tmp/layer_revert.json")
    every = ["none", *GROUPS, "random"]
    variants = sys.argv[4].split(",") if len(sys.argv) > 4 else every
    if set(variants) - set(every):
        sys.exit(f"variants {sorted(set(variants) - set(every))} are not among {every}")
    torch.set_num_threads(1)
    print(table(measure(Path(sys.argv[1]), chosen, out, variants), chosen))
