"""Model families: which components class loads a pipeline directory.

A family supplies the rollout what differs between FLUX, SD3 and the others: how a
directory loads, how prompts encode, the latent layout (the engine's sample shape),
the velocity adapter (guidance, timestep convention) and the VAE decode. Every
family's components class has ``load``, ``for_inference``, ``device``, ``latent_size``,
``packed_shape``, ``velocity_model``, ``encode_prompts`` and ``decode``. A directory
names its family in ``model_index.json`` (``_class_name``), as diffusers reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import torch


class PipelineComponents(Protocol):
    """What a family's components class gives the rollout, the evaluator and the learner."""

    transformer: Any
    vae: Any
    path: Path | None

    @property
    def device(self) -> torch.device: ...

    def for_inference(self) -> PipelineComponents: ...

    def latent_size(self, height: int, width: int) -> tuple[int, int]: ...

    def packed_shape(self, height: int, width: int) -> tuple[int, ...]: ...

    def velocity_model(self, height: int, width: int, **kwargs) -> Any: ...

    def encode_prompts(
        self, prompts: list[str], max_sequence_length: int, batch: int = 32
    ) -> dict: ...

    def decode(
        self, latents: torch.Tensor, height: int, width: int, batch: int = 64
    ) -> torch.Tensor: ...


PIPELINES = {  # diffusers' pipeline class -> the family
    "FluxPipeline": "flux",
    "StableDiffusion3Pipeline": "sd3",
    "QwenImagePipeline": "qwenimage",
}


def family_of(path: str | Path) -> str:
    """The family of a diffusers pipeline directory, from its model_index.json."""
    index = Path(path) / "model_index.json"
    try:
        name = json.loads(index.read_text())["_class_name"]
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{index}: cannot read the pipeline's _class_name ({e})") from None
    if name not in PIPELINES:
        known = ", ".join(sorted(PIPELINES))
        raise ValueError(f"{index}: pipeline {name!r} is not a family g2rpo trains ({known})")
    return PIPELINES[name]


def components_class(family: str):
    if family == "flux":
        from .flux_pipeline import FluxComponents

        return FluxComponents
    if family == "sd3":
        from .sd3_pipeline import SD3Components

        return SD3Components
    if family == "qwenimage":
        from .qwenimage_pipeline import QwenImageComponents

        return QwenImageComponents
    raise ValueError(f"unknown model family {family!r}")


def config_family(cfg) -> str:
    """The family of a run config's ``model.pretrained`` (FLUX for the built-in test
    model, which has none)."""
    from ..paths import resolve_path

    if cfg.model.pretrained is None:
        return "flux"
    return family_of(resolve_path(cfg.model.pretrained))


def family_class(cfg):
    """The components class of a run config's family."""
    return components_class(config_family(cfg))


def load_components(path: str | Path, **kwargs):
    """The components of the pipeline at ``path``, by its family (``load``'s kwargs)."""
    from .loaders import resolve_local_dir

    root = resolve_local_dir(path, "pipeline", required=("model_index.json",))
    return components_class(family_of(root)).load(root, **kwargs)


def pipeline_sampling_grid(
    pipeline: str | Path | None,
    num_steps: int,
    shift: float,
    quantize: bool,
    kind: str,
    image_size: int,
):
    """The σ grid a run samples on: ``schedules.sampling_grid``, except the diffusers
    grid of a family whose pipeline shifts σ by resolution (Qwen-Image), which is that
    pipeline's own scheduler's at this image size (``sampling.shift`` plays no part)."""
    from ..algorithms.schedules import SamplingGrid, model_timestep, sampling_grid

    if kind == "diffusers" and pipeline is not None and family_of(pipeline) == "qwenimage":
        from .qwenimage_pipeline import pipeline_sigmas

        sigmas = pipeline_sigmas(pipeline, num_steps, image_size, image_size)
        return SamplingGrid(sigmas=sigmas, timesteps=model_timestep(sigmas.float(), quantize))
    return sampling_grid(num_steps, shift, quantize, kind)


def config_sampling_grid(cfg):
    """``pipeline_sampling_grid`` of a run config."""
    from ..paths import resolve_path

    s = cfg.sampling
    pretrained = cfg.model.pretrained
    pipeline = None if pretrained is None else resolve_path(pretrained)
    return pipeline_sampling_grid(
        pipeline,
        s.num_steps,
        s.shift,
        cfg.model.quantize_timestep,
        s.sigma_grid,
        cfg.train.image_size,
    )
