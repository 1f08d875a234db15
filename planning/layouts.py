"""``g2rpo plan --gpus N``: the fastest layout of a run on N GPUs that the memory plan
says fits.

The algorithm's batch stays the config's: prompts per iteration (every worker's share
summed: ``train.workers.prompt_counts``, or workers x ``sampling.prompts_per_worker``),
group size, steps. What moves is where it runs: colocated pairs (n workers and n learner
ranks on n GPUs, in turns) with the job's reward replicas on GPUs of their own or inside
the pairs (``train.reward.in_pairs``), or disaggregated whole-GPU workers and learner
ranks; the held-out evaluation on an evaluator GPU or on the workers. Any number of
workers up to the prompts is tried, not only divisors: the prompts are split as evenly
as they go (``train.workers.prompt_counts``), so a layout can use every GPU it has. A
learner group larger than a node (``--gpus-per-node``) spreads over nodes (PACK) and
its FSDP2 traffic crosses ``--network``. Each candidate is validated as a config (so
every refusal of the config holds), planned against the GPU's memory and timed at the
calibration table's rates; the fastest that fits wins, and each says how many of the N
GPUs it leaves idle.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from pydantic import ValidationError

from ..common.config.loading import apply_override, config_from_dict
from ..common.config.run import G2RPOConfig
from ..common.errors import ConfigError
from .calibration import Calibration
from .estimate import plan
from .timing import estimate_time

# a pair's shares of its GPU with a reward replica inside it (Ray's accounting only: the
# memory plan counts what each holds, planning/pairs.py)
IN_PAIR_SHARES = {"workers": 0.45, "learner": 0.45, "reward": 0.1}


@dataclass
class Layout:
    sets: list[str]  # the --set lines that make it
    gpus: float
    iteration_s: float
    fits: bool
    why: str = ""  # why it does not fit or is refused
    idle: int = 0  # of the N GPUs, those no actor of the layout asks for


def split_sets(prompts: int, workers: int) -> list[str]:
    """The --set lines that give ``workers`` workers ``prompts`` prompts, as evenly as
    they go (the larger shares first)."""
    per, extra = divmod(prompts, workers)
    if extra == 0:
        return [f"sampling.prompts_per_worker={per}", "train.workers.prompt_counts=null"]
    counts = [per + 1] * extra + [per] * (workers - extra)
    return [
        f"sampling.prompts_per_worker={per + 1}",
        f"train.workers.prompt_counts=[{', '.join(map(str, counts))}]",
    ]


def _strategy(ranks: int, gpus_per_node: int) -> str:
    spread = "PACK" if ranks > gpus_per_node else "STRICT_PACK"
    return f"train.learner.placement_strategy={spread}"


def candidate_sets(cfg: G2RPOConfig, gpus: int, gpus_per_node: int = 8) -> list[list[str]]:
    """Every layout of ``cfg``'s batch on at most ``gpus`` GPUs, as --set lines."""
    t = cfg.train
    prompts = sum(t.workers.prompt_shares(cfg.sampling.prompts_per_worker))
    replicas = t.reward.job_replicas()
    apart = math.ceil(replicas * t.reward.num_gpus - 1e-9)  # replicas on GPUs of their own
    # in the pairs only where the job starts replicas and they run on a GPU
    placings = (False, True) if replicas and t.reward.num_gpus > 0 else (False,)
    out = []
    for on_actor in (False, True):
        evaluator = math.ceil(t.eval.num_gpus) if on_actor else 0
        if on_actor and evaluator == 0:
            continue
        shared = [f"train.eval.on_actor={str(on_actor).lower()}"]
        for in_pairs in placings:
            room = gpus - evaluator - (0 if in_pairs else apart)
            shares = IN_PAIR_SHARES if in_pairs else {"workers": 0.5, "learner": 0.5}
            reward = [f"train.reward.in_pairs={str(in_pairs).lower()}"]
            if in_pairs:
                reward.append(f"train.reward.num_gpus={shares['reward']}")
            for pairs in range(max(1, replicas if in_pairs else 1), min(prompts, room) + 1):
                out.append(
                    [
                        "train.placement=colocated",
                        f"train.workers.count={pairs}",
                        f"train.workers.num_gpus={shares['workers']}",
                        f"train.learner.count={pairs}",
                        f"train.learner.num_gpus={shares['learner']}",
                        _strategy(pairs, gpus_per_node),
                        "train.weights.staleness=0",
                        "train.weights.transport=object_store",
                        *reward,
                        *split_sets(prompts, pairs),
                        *shared,
                    ]
                )
        room = gpus - evaluator - apart
        for workers in range(1, min(prompts, room - 1) + 1):
            most = room - workers  # every GPU left to the learner, or one node's worth
            for ranks in sorted({most, min(most, gpus_per_node)}):
                out.append(
                    [
                        "train.placement=disaggregated",
                        f"train.workers.count={workers}",
                        "train.workers.num_gpus=1",
                        f"train.learner.count={ranks}",
                        "train.learner.num_gpus=1",
                        _strategy(ranks, gpus_per_node),
                        "train.reward.in_pairs=false",
                        *split_sets(prompts, workers),
                        *shared,
                    ]
                )
    return out


def layout_config(base: dict, sets: list[str]) -> G2RPOConfig:
    """``base`` (a config as JSON data) with ``sets``: config_from_dict without its YAML
    round trip (a search validates a hundred), its ConfigError where it is refused."""
    data = copy.deepcopy(base)
    for line in sets:
        apply_override(data, line)
    try:
        return G2RPOConfig.model_validate(data)
    except ValidationError:
        return config_from_dict(base, sets)  # raises the ConfigError naming the fields


def search(
    cfg: G2RPOConfig,
    gpus: int,
    gpu_memory_gib: float,
    cal: Calibration,
    network: str = "ib",
    gpus_per_node: int = 8,
) -> list[Layout]:
    """Every candidate, fastest fitting first (then the misfits and refusals); of equal
    time, the one with fewer GPUs idle."""
    base = cfg.model_dump(mode="json")
    found = []
    for sets in candidate_sets(cfg, gpus, gpus_per_node):
        try:
            c = layout_config(base, sets)
        except ConfigError as e:
            found.append(Layout(sets, 0, math.inf, False, str(e).splitlines()[0]))
            continue
        p = plan(c, gpu_memory_gib)
        misfit = [a.actor for a in p.actors if not a.fits]
        seconds = estimate_time(c, cal, network, gpus_per_node).iteration_s
        why = f"{', '.join(misfit)} do(es) not fit" if misfit else ""
        idle = gpus - math.ceil(p.gpus_asked - 1e-9)
        found.append(Layout(sets, p.gpus_asked, seconds, not misfit, why, idle))
    return sorted(found, key=lambda x: (not x.fits, round(x.iteration_s, 6), x.idle))


def format_search(found: list[Layout], gpus: int, shown: int = 5) -> str:
    fit = [x for x in found if x.fits]
    if not fit:
        reasons = sorted({x.why for x in found})[:5]
        return f"no layout on {gpus} GPUs fits; e.g. " + "; ".join(reasons)
    best = fit[0]
    lines = [
        f"fastest layout on {gpus} GPUs that fits: {best.iteration_s:.1f} s an iteration, "
        f"{best.gpus:g} GPUs asked, {best.idle} idle",
        "    --set " + " --set ".join(best.sets),
        f"next {min(shown, len(fit) - 1)} of {len(fit)} that fit:",
    ]
    for x in fit[1 : shown + 1]:
        brief = " ".join(s for s in x.sets if not s.startswith("train.weights"))
        lines.append(f"    {x.iteration_s:>8.1f} s  {x.gpus:g} GPUs ({x.idle} idle)  {brief}")
    return "\n".join(lines)
