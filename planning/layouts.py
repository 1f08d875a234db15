"""``g2rpo plan --gpus N``: the fastest layout of a run on N GPUs that the memory plan
says fits.

The algorithm's batch stays the config's: prompts per iteration (workers x
``sampling.prompts_per_worker``), group size, steps. What moves is where it runs:
colocated pairs (n workers and n learner ranks on n GPUs, in turns) or disaggregated
whole-GPU workers and learner ranks, the held-out evaluation on an evaluator GPU or on
the workers, the reward replicas as configured. Each candidate is validated as a config
(so every refusal of the config holds), planned against the GPU's memory and timed at
the calibration table's rates; the fastest that fits wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..common.config import ConfigError, G2RPOConfig, config_from_dict
from .calibration import Calibration
from .estimate import plan
from .timing import estimate_time


@dataclass
class Layout:
    sets: list[str]  # the --set lines that make it
    gpus: float
    iteration_s: float
    fits: bool
    why: str = ""  # why it does not fit or is refused


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_sets(cfg: G2RPOConfig, gpus: int) -> list[list[str]]:
    """Every layout of ``cfg``'s batch on at most ``gpus`` GPUs, as --set lines."""
    t = cfg.train
    prompts = t.workers.count * cfg.sampling.prompts_per_worker
    reward = math.ceil(t.reward.job_replicas() * t.reward.num_gpus - 1e-9)
    out = []
    for on_actor in (False, True):
        evaluator = math.ceil(t.eval.num_gpus) if on_actor else 0
        if on_actor and evaluator == 0:
            continue
        room = gpus - reward - evaluator
        shared = [f"train.eval.on_actor={str(on_actor).lower()}"]
        for workers in _divisors(prompts):
            per = [f"sampling.prompts_per_worker={prompts // workers}"]
            if workers <= room:  # colocated: n pairs on n GPUs
                out.append(
                    [
                        "train.placement=colocated",
                        f"train.workers.count={workers}",
                        "train.workers.num_gpus=0.5",
                        f"train.learner.count={workers}",
                        "train.learner.num_gpus=0.5",
                        "train.weights.staleness=0",
                        "train.weights.transport=object_store",
                        *per,
                        *shared,
                    ]
                )
            for ranks in range(1, room - workers + 1):
                out.append(
                    [
                        "train.placement=disaggregated",
                        f"train.workers.count={workers}",
                        "train.workers.num_gpus=1",
                        f"train.learner.count={ranks}",
                        "train.learner.num_gpus=1",
                        *per,
                        *shared,
                    ]
                )
    return out


def search(cfg: G2RPOConfig, gpus: int, gpu_memory_gib: float, cal: Calibration) -> list[Layout]:
    """Every candidate, fastest fitting first (then the misfits and refusals)."""
    base = cfg.model_dump(mode="json")
    found = []
    for sets in candidate_sets(cfg, gpus):
        try:
            c = config_from_dict(base, sets)
        except ConfigError as e:
            found.append(Layout(sets, 0, math.inf, False, str(e).splitlines()[0]))
            continue
        p = plan(c, gpu_memory_gib)
        misfit = [a.actor for a in p.actors if not a.fits]
        seconds = estimate_time(c, cal).iteration_s
        why = f"{', '.join(misfit)} do(es) not fit" if misfit else ""
        found.append(Layout(sets, p.gpus_asked, seconds, not misfit, why))
    return sorted(found, key=lambda x: (not x.fits, x.iteration_s))


def format_search(found: list[Layout], gpus: int, shown: int = 5) -> str:
    fit = [x for x in found if x.fits]
    if not fit:
        reasons = sorted({x.why for x in found})[:5]
        return f"no layout on {gpus} GPUs fits; e.g. " + "; ".join(reasons)
    best = fit[0]
    lines = [
        f"fastest layout on {gpus} GPUs that fits: {best.iteration_s:.1f} s an iteration, "
        f"{best.gpus:g} GPUs",
        "    --set " + " --set ".join(best.sets),
        f"next {min(shown, len(fit) - 1)} of {len(fit)} that fit:",
    ]
    for x in fit[1 : shown + 1]:
        brief = " ".join(s for s in x.sets if not s.startswith("train.weights"))
        lines.append(f"    {x.iteration_s:>8.1f} s  {x.gpus:g} GPUs  {brief}")
    return "\n".join(lines)
