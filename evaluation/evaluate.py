"""``g2rpo eval``: sample a policy on fixed prompts with fixed noise (the same noise
for every model compared), score every sample in this process, and summarise with
95% bootstrap CIs over prompts and paired differences against a base model."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from tqdm.auto import tqdm

from ..common.families.registry import PipelineComponents, pipeline_sampling_grid
from ..common.health import image_health
from ..common.prompts.prompts import read_prompts
from ..rollout_worker.engine import RolloutEngine
from ..rollout_worker.plan import anchor_plan
from .metrics import embed_samples, make_scorers, score_samples

SPLIT_SEED_OFFSET = {"held_out": 0, "train": 1}


class EvalSettings(BaseModel):
    """How a policy is sampled and scored (a run's own sampling settings by default)."""

    model_config = ConfigDict(extra="forbid")
    splits: list[str] = Field(
        default_factory=lambda: ["held_out", "train"],
        description="held_out, train (shapes-world prompts) or a text file of prompts",
    )
    prompts_per_split: int = Field(40, ge=1)
    samples_per_prompt: int = Field(8, ge=1)
    seed: int = Field(10_000, description="noise seed (held_out: seed, train: seed+1, files +2)")
    num_steps: int = Field(16, ge=2)
    shift: float = Field(3.0, gt=0)
    sigma_grid: Literal["uniform", "diffusers"] = "uniform"
    image_size: int = Field(32, ge=16)
    max_sequence_length: int = Field(16, ge=1)
    guidance: float = 3.5
    quantize_timestep: bool = True
    scorers: list[str] = Field(default_factory=lambda: ["shapes_clip", "shapes_oracle"])
    batch: int = Field(256, ge=1, description="samples per sampling chunk")
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16"] = "float32"

    @classmethod
    def for_run(cls, cfg, **overrides) -> EvalSettings:
        """Sample as the run samples; score with the run's reward-server scorers."""
        s = cfg.sampling
        fields = dict(
            num_steps=s.num_steps,
            shift=s.shift,
            sigma_grid=s.sigma_grid,
            image_size=cfg.train.image_size,
            max_sequence_length=cfg.train.max_sequence_length,
            guidance=cfg.model.guidance,
            quantize_timestep=cfg.model.quantize_timestep,
        )
        if cfg.train.reward.scorers:
            fields["scorers"] = list(cfg.train.reward.scorers)
        fields.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**fields)


def pipeline_settings(pipeline: str | Path, **overrides) -> EvalSettings:
    """A bare pipeline directory sampled as its family samples (guidance, σ grid and
    timestep convention: the components class's ``SAMPLING``; on the scheduler's own
    grid, the static shift the scheduler was saved with), where no run says."""
    from ..common.families.registry import components_class, family_of

    family = dict(components_class(family_of(pipeline)).SAMPLING)
    scheduler = Path(pipeline) / "scheduler" / "scheduler_config.json"
    if family.get("sigma_grid") == "diffusers" and scheduler.is_file():
        config = json.loads(scheduler.read_text())
        shift = config.get("shift")
        if not config.get("use_dynamic_shifting") and isinstance(shift, int | float) and shift > 0:
            family["shift"] = float(shift)
    return EvalSettings(**{**family, **{k: v for k, v in overrides.items() if v is not None}})


def split_prompts(split: str, count: int) -> list[str]:
    """The first ``count`` prompts of a split; ``train`` is a fixed spread sample."""
    if split == "held_out":
        return read_prompts("shapes:held_out", "splits")[:count]
    if split == "train":
        train = read_prompts("shapes:train", "splits")
        pick = np.random.default_rng(0).choice(len(train), min(count, len(train)), replace=False)
        return [train[i] for i in sorted(pick)]
    return read_prompts(split, "splits")[:count]


def split_seed(split: str, seed: int) -> int:
    return seed + SPLIT_SEED_OFFSET.get(split, 2)


@dataclass
class SplitSamples:
    split: str
    prompts: list[str]  # distinct prompts; sample i belongs to prompts[i // per_prompt]
    per_prompt: int
    images: np.ndarray  # uint8 [P·n, H, W, 3]
    values: dict[str, np.ndarray]  # metric → [P·n]
    embeddings: np.ndarray | None = None  # float16 [P·n, D] unit image features, or None
    embedding_scorer: str | None = None  # the scorer they are of

    # Computed once: a base's are read for every model compared against it.
    @cached_property
    def thumbnails(self) -> np.ndarray:
        return image_health.thumbnails(self.images)

    @cached_property
    def image_measures(self) -> dict[str, np.ndarray]:
        return image_health.per_image(self.images)

    def tiles(self, rows: list[int], k: int) -> np.ndarray:
        """[len(rows), k, H, W, 3]: the first k samples of the chosen prompts."""
        n = self.per_prompt
        return np.stack([self.images[r * n : r * n + k] for r in rows])


@torch.no_grad()
def sample_fixed_noise(
    comps: PipelineComponents,
    prompts: list[str],
    noise_seed: int,
    settings: EvalSettings,
    *,
    progress: bool = False,
) -> np.ndarray:
    """Deterministic ODE samples: noise row i is drawn for sample i from one
    generator (as the training-time eval draws it), whatever the chunking."""
    size = settings.image_size
    shape = comps.packed_shape(size, size)
    noise = torch.randn((len(prompts), *shape), generator=torch.Generator().manual_seed(noise_seed))
    model = comps.velocity_model(
        size,
        size,
        guidance=settings.guidance,
        autocast_dtype=None if settings.dtype == "float32" else torch.bfloat16,
    )
    engine = RolloutEngine(
        model,
        pipeline_sampling_grid(
            comps.path,
            settings.num_steps,
            settings.shift,
            settings.quantize_timestep,
            settings.sigma_grid,
            size,
        ),
        max_batch=settings.batch,
    )
    out = []
    chunks = range(0, len(prompts), settings.batch)
    for lo in tqdm(chunks, desc="sampling", disable=not progress, leave=False):
        chunk = prompts[lo : lo + settings.batch]
        cond = comps.encode_prompts(chunk, settings.max_sequence_length)
        plan = anchor_plan(len(chunk), settings.num_steps)
        empty = noise.new_zeros((0, *shape))
        result = engine.run(plan, cond, noise[lo : lo + len(chunk)].to(comps.device), empty)
        out.append(comps.decode(result.leaf_latents, size, size).numpy())
    return np.concatenate(out)


def evaluate_policy(
    comps: PipelineComponents,
    settings: EvalSettings,
    scorers: dict | None = None,
    *,
    progress: bool = False,
) -> dict[str, SplitSamples]:
    """Sample and score every split; the samples' image embeddings by the first scorer
    that has them (for ``diversity_embed``)."""
    scorers = scorers or make_scorers(settings.scorers, settings.device)
    out = {}
    for split in settings.splits:
        prompts = split_prompts(split, settings.prompts_per_split)
        n = settings.samples_per_prompt
        listed = [p for p in prompts for _ in range(n)]
        images = sample_fixed_noise(
            comps, listed, split_seed(split, settings.seed), settings, progress=progress
        )
        values = score_samples(scorers, images, listed)
        embedder, embeddings = embed_samples(scorers, images)
        out[split] = SplitSamples(split, prompts, n, images, values, embeddings, embedder)
    return out
