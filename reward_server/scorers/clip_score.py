"""CLIP-family scorers through ``transformers.CLIPModel``/``CLIPProcessor`` from a local dir.

``clip_score``: cosine similarity of the image and prompt embeddings (the DFN5B
score of G²RPO's HPS&CLIP setting). ``pickscore``: the same cosine times
exp(logit_scale), PickScore's scale (≈ 22 for real checkpoints).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ...common.loaders import resolve_local_dir
from .base import check_batch


class ClipScore:
    """CLIP cosine (or PickScore-scaled) scorer of a local CLIP checkpoint."""

    def __init__(
        self,
        path: str | Path,
        *,
        name: str = "clip_score",
        scale: str = "cosine",
        device: str = "cpu",
        batch_size: int = 64,
    ) -> None:
        from transformers import CLIPModel, CLIPProcessor

        if scale not in ("cosine", "logit"):
            raise ValueError(f"scale must be 'cosine' or 'logit', got {scale!r}")
        local = resolve_local_dir(path, name, required=("config.json",))
        self.model = CLIPModel.from_pretrained(local, local_files_only=True).to(device).eval()
        self.processor = CLIPProcessor.from_pretrained(local, local_files_only=True)
        self.name = name
        self.scale = scale
        self.device = torch.device(device)
        self.batch_size = batch_size
        digest = hashlib.sha256((local / "config.json").read_bytes()).hexdigest()[:8]
        self.version = f"{local.name}-{digest}"

    @torch.no_grad()
    def score(self, images, prompts: list[str]) -> np.ndarray:
        arr = check_batch(images, prompts)
        out = []
        for lo in range(0, arr.shape[0], self.batch_size):
            batch = [Image.fromarray(img) for img in arr[lo : lo + self.batch_size]]
            inputs = self.processor(
                text=list(prompts[lo : lo + self.batch_size]),
                images=batch,
                return_tensors="pt",
                padding=True,
                truncation=True,
            ).to(self.device)
            res = self.model(**inputs)
            cos = (res.image_embeds * res.text_embeds).sum(dim=-1)
            if self.scale == "logit":
                cos = cos * self.model.logit_scale.exp()
            out.append(cos.float().cpu())
        if not out:
            return np.zeros(0, dtype=np.float32)
        return torch.cat(out).numpy().astype(np.float32)
