"""Scorers by name: ``make_scorer("shapes_clip")``, ``make_scorer("pickscore", path=...)``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ...common.errors import UsageError
from ...common.paths import resolve_path
from .base import Scorer


def _shapes_oracle(**_) -> Scorer:
    from .shapes_oracle import ShapesOracle

    return ShapesOracle()


def _shapes_strict(**_) -> Scorer:
    from .shapes_oracle import ShapesStrict

    return ShapesStrict()


def _jpeg(quality: int = 95, **_) -> Scorer:
    from .jpeg import JpegCompressibility

    return JpegCompressibility(quality=quality)


def _local_dir(name: str, path, default: Path | None, kind: str | None) -> Path:
    if path is None and default is None:
        raise UsageError(f"scorer {name!r} needs path= (a local checkpoint directory)")
    # a relative path as the trainer's model paths: working dir, then the project root
    path = resolve_path(Path(path).expanduser()) if path else Path(default)
    if kind and path.is_file():
        raise UsageError(
            f"scorer {name!r}: {path} is the original checkpoint file; convert it once with "
            f"`g2rpo convert-reward {kind} {path} OUT_DIR --tokenizer TOKENIZER` and serve OUT_DIR"
        )
    return path


def _clip(name: str, scale: str, default: Path | None = None, kind: str | None = None):
    def factory(path=None, device: str = "cpu", dtype: str = "auto", **_) -> Scorer:
        from .clip_score import ClipScore

        local = _local_dir(name, path, default, kind)
        return ClipScore(local, name=name, scale=scale, device=device, dtype=dtype)

    return factory


def _image_reward(path=None, device: str = "cpu", dtype: str = "auto", **_) -> Scorer:
    from .image_reward import ImageRewardScore

    local = _local_dir("image_reward", path, None, "image_reward")
    return ImageRewardScore(local, device=device, dtype=dtype)


def _registry() -> dict[str, Callable[..., Scorer]]:
    from ...common.paths import DEFAULT_WORLD

    return {
        "shapes_oracle": _shapes_oracle,
        "shapes_strict": _shapes_strict,  # the oracle's pass alone: a sparse 0/1 reward
        "jpeg_compressibility": _jpeg,
        "shapes_clip": _clip("shapes_clip", "cosine", DEFAULT_WORLD / "shapes_clip"),
        # DFN5B-CLIP (G²RPO's CLIP reward) once converted: convert-reward dfn5b_clip
        "clip_score": _clip("clip_score", "cosine", kind="dfn5b_clip"),
        "pickscore": _clip("pickscore", "logit"),
        # HPS-v2.1's score is the cosine of its OpenCLIP ViT-H-14 features (≈0.3)
        "hpsv2": _clip("hpsv2", "cosine", kind="hpsv2"),
        "image_reward": _image_reward,
    }


# The scorers whose objects have an image tower (``base.Embedder``): a worker picks the
# one whose embeddings an evaluation asks for by name, without the scorer at hand
# (tests/test_embedding_diversity.py checks this against the objects).
EMBEDDING_SCORERS = frozenset({"shapes_clip", "clip_score", "pickscore", "hpsv2", "image_reward"})


def scorer_names() -> list[str]:
    return sorted(_registry())


def make_scorer(name: str, **kwargs) -> Scorer:
    registry = _registry()
    if name not in registry:
        raise UsageError(f"unknown scorer {name!r}; known: {', '.join(sorted(registry))}")
    return registry[name](**kwargs)
