"""The held-out evaluation of a published version, on the evaluator actor (beside the
rollout), or spread over the rollout workers before it (``train.eval.on_actor: false``):
each worker samples a contiguous slice of the evaluation with the noise that slice has
in the whole one, so a FLUX evaluation of 400 samples costs each of 16 workers 25 samples
(about 43 s at 9.3 NFE/s) instead of holding the driver ~11 minutes on one evaluator.
Every part comes back with its scores and only the sample grid's images."""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, replace

import numpy as np
import ray

from ..common.wire.messages import EvalSamples
from ..run_directory.files import grid_samples
from .cluster import call_with_restart


def eval_slices(total: int, parts: int) -> list[tuple[int, int]]:
    """(first, count) of each of ``parts`` contiguous, near-equal slices of ``total``
    samples, in order; empty ones left out."""
    bounds = np.linspace(0, total, parts + 1).round().astype(int)
    return [(int(a), int(b - a)) for a, b in itertools.pairwise(bounds) if b > a]


@dataclass
class EvalPart:
    actor: object
    first: int
    count: int
    ref: object


@dataclass
class PendingEval:
    iteration: int
    weights: object  # the Published version it evaluates
    parts: list[EvalPart]
    nfe_train_total: int


def start_parts(actors: list, prompts: list[str], seed: int, grid: list[int], endpoints):
    """Each actor evaluates its slice of ``prompts`` (one per sample); the images of a
    slice at ``grid`` (sample indices) come back with it."""
    parts = []
    for actor, (first, count) in zip(actors, eval_slices(len(prompts), len(actors)), strict=False):
        parts.append(EvalPart(actor, first, count, None))
        parts[-1].ref = evaluate_part(parts[-1], prompts, seed, grid, endpoints)
    return parts


def returned_samples(num_samples: int, eval_cfg) -> list[int]:
    """The evaluation samples whose images come back to the driver: the sample grid's,
    or every one under ``train.eval.keep_images``."""
    if eval_cfg.keep_images:
        return list(range(num_samples))
    return grid_samples(num_samples, eval_cfg.per_prompt)


def set_images_aside(run_dir, iteration: int, samples: EvalSamples, per_prompt: int):
    """Every image of an evaluation saved as ``evals/it_N.images.npz`` (uint8 [N, H, W, 3],
    for a study that measures them afterwards); the samples with the grid's images only."""
    path = run_dir / "evals" / f"it_{iteration:05d}.images.npz"
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, images=samples.images)
    tmp.replace(path)  # whole or absent: a killed run leaves no half file under the name
    return replace(samples, images=samples.images[grid_samples(len(samples.images), per_prompt)])


def evaluate_part(part: EvalPart, prompts, seed, grid, endpoints):
    end = part.first + part.count
    keep = [i - part.first for i in grid if part.first <= i < end]
    mine = prompts[part.first : end]
    return part.actor.evaluate.remote(mine, seed, endpoints, keep, part.first, len(prompts))


def gather(pending: PendingEval, redo, timeout_s: float | None, restart_s: float):
    """Every part's samples merged in order, each part redone on its actor (Ray
    restarted) where it died or was sampled with other weights; None when a part is
    not back within ``timeout_s`` (its actor is then killed, Ray restarts it)."""
    got = []
    for part in pending.parts:

        def again(actor, part=part):
            return redo(actor, part)

        try:
            samples = ray.get(part.ref, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.kill(part.actor, no_restart=False)  # stuck or slow: Ray restarts it
            print(
                f"the evaluation of iteration {pending.iteration} was not back within "
                f"train.eval.timeout_s={timeout_s:g} s: abandoned (its actor is restarted)",
                file=sys.stderr,
            )
            return None
        except ray.exceptions.RayActorError:  # restarted by Ray: load the weights, redo
            samples = call_with_restart(again, part.actor, restart_s=restart_s)
        if samples.version != pending.weights.version:
            # restarted by Ray after the weights reached it and before the evaluation:
            # the new actor sampled with the weights it starts with. Redo it.
            samples = call_with_restart(again, part.actor, restart_s=restart_s)
        got.append(samples)
    return merge(got)


def merge(parts: list[EvalSamples]) -> EvalSamples:
    """Consecutive slices' samples as one evaluation's (the slowest part's seconds)."""
    if len(parts) == 1:
        return parts[0]
    scores = {name: [s for p in parts for s in p.scores[name]] for name in parts[0].scores}
    health = {name: [s for p in parts for s in p.health[name]] for name in parts[0].health}
    shown = [p.images for p in parts if len(p.images)]
    images = np.concatenate(shown) if shown else parts[0].images
    thumbs = [p.thumbnails for p in parts]
    embeds = [p.embeddings for p in parts]
    return EvalSamples(
        images,
        scores,
        max(p.seconds for p in parts),
        parts[0].version,
        health=health,
        thumbnails=None if any(t is None for t in thumbs) else np.concatenate(thumbs),
        # a part without (a worker of before embeddings): none, never a partial column
        embeddings=None if any(e is None for e in embeds) else np.concatenate(embeds),
        embedding_scorer=parts[0].embedding_scorer,
    )


def _against_first(thumbs: np.ndarray, first: dict | None, per_prompt: int) -> dict:
    """The thumbnail measures against the run's first evaluation; the distances left out
    when that evaluation has no thumbnails (a run begun before they were kept) or other
    samples (``train.eval`` changed on a resume), where they would read as 0."""
    from ..common.health import image_health

    if first is None:  # the first evaluation: its own base
        return image_health.against_base(thumbs, None, per_prompt)
    base = first.get("thumbnails")
    base = None if base is None else image_health.decode_thumbnails(base)
    if base is None or base.shape != thumbs.shape:
        return image_health.own_measures(thumbs, per_prompt)
    return image_health.against_base(thumbs, base, per_prompt)


def record_evaluation(run_dir, pending: PendingEval, samples, prompts, per_prompt, first, trained):
    """Save an evaluation's per-sample scores and image-health measures (evals/it_N.json,
    with the thumbnails the next evaluations are measured against) and its sample grid;
    returns (the record, its row entries: means, the paired change since ``first``, the
    run's first evaluation, and the trained-vs-held-out drift of the ``trained`` rewards,
    {name: weight})."""
    from ..common.health import image_health
    from ..common.health.embedding_diversity import NAME as DIVERSITY_EMBED
    from ..common.health.embedding_diversity import embedding_diversity
    from ..evaluation.metrics import pass_from_scores
    from ..run_directory.eval_rows import HEALTH, drift_entries, eval_row
    from ..run_directory.files import save_evaluation, write_sample_grid

    values = pass_from_scores(samples.scores)
    health = {k: np.asarray(v, dtype=np.float64) for k, v in samples.health.items()}
    record = {
        "iteration": pending.iteration,
        "version": pending.weights.version,
        "nfe_train_total": pending.nfe_train_total,
        "prompts": prompts[::per_prompt],
        "per_prompt": per_prompt,
        "scores": {k: v.round(6).tolist() for k, v in values.items()},
    }
    if samples.thumbnails is not None:
        health.update(_against_first(samples.thumbnails, first, per_prompt))
        record["thumbnails"] = image_health.encode_thumbnails(samples.thumbnails)
    if samples.embeddings is not None and per_prompt >= 2:  # (one sample: no pair)
        health[DIVERSITY_EMBED] = embedding_diversity(samples.embeddings, per_prompt)
        record["embedding_scorer"] = samples.embedding_scorer
    record["health"] = {k: v.round(6).tolist() for k, v in health.items()}
    save_evaluation(run_dir, pending.iteration, record)
    write_sample_grid(
        run_dir / "samples" / f"it_{pending.iteration:05d}.png",
        samples.images,
        prompts,
        per_prompt,
        title=f"iteration {pending.iteration} (weights v{pending.weights.version}), "
        "held-out prompts",
    )
    # the row from the values as recorded (6 decimals), as the first evaluation's are read
    # back: unchanged samples then differ by exactly 0, not by rounding (an upper CI bound
    # of -1e-7 would hold G2rpoRewardCollapse pending on a run that did not move)
    recorded = {**values, **{HEALTH + k: v for k, v in health.items()}}
    recorded = {k: np.round(v, 6) for k, v in recorded.items()}
    row = eval_row(recorded, first, per_prompt)
    row.update(drift_entries(row, trained))
    return record, {**row, "time/eval_work_s": samples.seconds}
