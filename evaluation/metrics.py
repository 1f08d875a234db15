"""Per-sample evaluation metrics from scorers run in this process, and their
summaries (means with bootstrap CIs over prompts, paired differences).

Metric names: a scorer's own name for its score, and for the analytic checker
``shapes_oracle/pass`` (the strict pass rate: background, foreground colour and
shape all right) with its parts ``/bg``, ``/fg``, ``/shape``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..common.algorithms.stats import Interval, bootstrap_mean, paired_difference, per_prompt_means
from ..common.errors import UsageError

ORACLE = "shapes_oracle"
PASS = f"{ORACLE}/pass"
ORACLE_PARTS = ("pass", "bg", "fg", "shape")


def make_scorers(specs: list[str], device: str = "cpu") -> dict:
    """``NAME`` or ``NAME=LOCAL_DIR`` → scorer objects (the reward server's own)."""
    from ..reward_server.scorers.registry import make_scorer
    from ..reward_server.settings import ScorerSpec

    if not specs:
        raise UsageError("--scorers: at least one scorer is needed")
    out = {}
    for text in specs:
        spec = ScorerSpec.parse(text)
        kwargs = {"device": device}
        if spec.path:
            kwargs["path"] = spec.path
        out[spec.name] = make_scorer(spec.name, **kwargs)
    return out


def score_samples(scorers: Mapping, images: np.ndarray, prompts: list[str]) -> dict:
    """Every metric of every sample: {metric: float64 [N]}."""
    out: dict[str, np.ndarray] = {}
    for name, scorer in scorers.items():
        out[name] = np.asarray(scorer.score(images, prompts), dtype=np.float64)
        if name == ORACLE:
            checks = scorer.checks(images, prompts)
            for part, attr in zip(
                ORACLE_PARTS, ("passed", "bg_ok", "fg_ok", "shape_ok"), strict=True
            ):
                out[f"{ORACLE}/{part}"] = np.array([getattr(c, attr) for c in checks], float)
    return out


def embedding_scorer_in(scorers: Mapping) -> str | None:
    """The first of ``scorers`` (name -> scorer object) with an image tower, or None."""
    from ..reward_server.scorers.base import can_embed

    return next((name for name, scorer in scorers.items() if can_embed(scorer)), None)


def embed_samples(scorers: Mapping, images: np.ndarray) -> tuple[str | None, np.ndarray | None]:
    """(scorer, float16 [N, D] unit image embeddings) of the first scorer with an image
    tower, rounded as the reward server sends them; (None, None) without one."""
    name = embedding_scorer_in(scorers)
    if name is None:
        return None, None
    return name, np.asarray(scorers[name].embed(images), dtype=np.float16)


def embed_saved_images(specs: list[str], images: np.ndarray, device: str = "cpu") -> dict:
    """Image embeddings of saved images (uint8 [N, H, W, 3], e.g. an evaluation's
    ``evals/it_N.images.npz``) in this process: {scorer: float32 [N, D], unit rows} for
    each scorer of ``specs`` (``NAME`` or ``NAME=LOCAL_DIR``, as ``train.reward.scorers``)
    that has an image tower."""
    from ..reward_server.scorers.base import can_embed
    from ..reward_server.scorers.registry import EMBEDDING_SCORERS

    scorers = make_scorers(specs, device)
    out = {name: s.embed(images) for name, s in scorers.items() if can_embed(s)}
    if not out:
        raise UsageError(
            f"scorers {sorted(scorers)}: none has an image embedding; "
            f"give one of {sorted(EMBEDDING_SCORERS)}"
        )
    return out


def pass_from_scores(scores: Mapping[str, list[float]]) -> dict[str, np.ndarray]:
    """Metrics from a reward server's scores: each score, and the checker's strict
    pass (all three criteria met ⇔ its score is 1)."""
    out = {name: np.asarray(v, dtype=np.float64) for name, v in scores.items()}
    if ORACLE in out:
        out[PASS] = (out[ORACLE] >= 1.0 - 1e-6).astype(np.float64)
    return out


def summarise(values: Mapping[str, np.ndarray], num_prompts: int, seed: int = 0) -> dict:
    """{metric: Interval} of the mean over prompts."""
    return {
        name: bootstrap_mean(per_prompt_means(v, num_prompts), seed=seed)
        for name, v in values.items()
    }


def paired(
    values: Mapping[str, np.ndarray],
    base: Mapping[str, np.ndarray],
    num_prompts: int,
    seed: int = 0,
) -> dict[str, Interval]:
    """{metric: Interval} of the paired per-prompt difference model − base."""
    return {
        name: paired_difference(
            per_prompt_means(v, num_prompts), per_prompt_means(base[name], num_prompts), seed=seed
        )
        for name, v in values.items()
        if name in base
    }
