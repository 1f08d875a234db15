"""Diversity of one prompt's samples in a scorer's image-embedding space.

``diversity_embed`` of a sample is the mean cosine distance between the samples of its
prompt (consecutive ``per_prompt`` rows, as an evaluation lists them):

    diversity_embed(g) = 1/(n(n−1)) · Σ_{i≠j in g} (1 − cos(e_i, e_j)),   n = per_prompt

repeated for each of the prompt's n samples; 0 for identical images, 1 for orthogonal
features, NaN with one sample a prompt (no pair). Unlike the 16×16 thumbnails'
``diversity`` (common/health/image_health.py) it sees content: a CLIP-family tower tells two
different scenes of one layout apart, and two crops of one scene together."""

from __future__ import annotations

import numpy as np

NAME = "diversity_embed"  # its name among an evaluation's health measures


def embedding_diversity(embeddings: np.ndarray, per_prompt: int) -> np.ndarray:
    """float64 [N]: each sample's prompt's mean pairwise cosine distance (the module's
    formula) over ``embeddings`` [N, D] (any scale: each row is normalised here; an all-zero
    row counts as orthogonal to every other); NaN with ``per_prompt`` < 2, or when N is
    not a whole number of prompts."""
    e = np.asarray(embeddings, dtype=np.float64)
    if e.ndim != 2:
        raise ValueError(f"embeddings must be [N, D], got shape {list(e.shape)}")
    n = len(e)
    if per_prompt < 2 or n % per_prompt:
        return np.full(n, np.nan)
    norm = np.linalg.norm(e, axis=1, keepdims=True)
    unit = np.divide(e, norm, out=np.zeros_like(e), where=norm > 0)
    groups = unit.reshape(n // per_prompt, per_prompt, -1)
    cos = np.einsum("gid,gjd->gij", groups, groups)
    distance = np.clip(1.0 - cos, 0.0, 2.0)  # rounding: never below 0
    own = np.arange(per_prompt)
    distance[:, own, own] = 0.0  # a sample's distance to itself is no pair
    pairs = per_prompt * (per_prompt - 1)
    return np.repeat(distance.sum(axis=(1, 2)) / pairs, per_prompt)
