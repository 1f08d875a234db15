"""Scorers by name: ``make_scorer("shapes_clip")``, ``make_scorer("pickscore", path=...)``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .base import Scorer


class ScorerUnavailable(RuntimeError):
    """A scorer whose optional package or checkpoint is missing on this machine."""


def _shapes_oracle(**_) -> Scorer:
    from .shapes_oracle import ShapesOracle

    return ShapesOracle()


def _jpeg(quality: int = 95, **_) -> Scorer:
    from .jpeg import JpegCompressibility

    return JpegCompressibility(quality=quality)


def _clip(name: str, scale: str, default: Path | None = None):
    def factory(path: str | Path | None = None, device: str = "cpu", **_) -> Scorer:
        from .clip_score import ClipScore

        if path is None and default is None:
            raise ValueError(f"scorer {name!r} needs path= (a local CLIP checkpoint directory)")
        return ClipScore(path or default, name=name, scale=scale, device=device)

    return factory


def _optional(name: str, module: str, extra: str) -> Callable[..., Scorer]:
    def factory(**_) -> Scorer:
        try:
            __import__(module)
        except Exception as exc:  # ImportError, or torchvision's RuntimeError on CPU torch
            raise ScorerUnavailable(
                f"scorer {name!r} needs the {module!r} package, which does not import here "
                f"({type(exc).__name__}: {exc}); install it with `pip install {extra}` on a "
                "machine whose torch has torchvision (CUDA builds), or use clip_score/pickscore"
            ) from None
        raise ScorerUnavailable(  # pragma: no cover - needs the package and its weights
            f"scorer {name!r}: the package imports, but its adapter is not implemented yet"
        )

    return factory


def _registry() -> dict[str, Callable[..., Scorer]]:
    from ...world import DEFAULT_WORLD

    return {
        "shapes_oracle": _shapes_oracle,
        "jpeg_compressibility": _jpeg,
        "shapes_clip": _clip("shapes_clip", "cosine", DEFAULT_WORLD / "shapes_clip"),
        "clip_score": _clip("clip_score", "cosine"),
        "pickscore": _clip("pickscore", "logit"),
        "hpsv2": _optional("hpsv2", "hpsv2", "hpsv2"),
        "image_reward": _optional("image_reward", "ImageReward", "image-reward"),
    }


def scorer_names() -> list[str]:
    return sorted(_registry())


def make_scorer(name: str, **kwargs) -> Scorer:
    registry = _registry()
    if name not in registry:
        raise ValueError(f"unknown scorer {name!r}; known: {', '.join(sorted(registry))}")
    return registry[name](**kwargs)
