"""CLIP-family scorers through ``transformers.CLIPModel``/``CLIPProcessor`` from a local dir.

``clip_score``: cosine similarity of the image and prompt embeddings (the DFN5B
score of G²RPO's HPS&CLIP setting). ``pickscore``: the same cosine times
exp(logit_scale), PickScore's scale (≈ 22 for real checkpoints).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ...common.loaders import resolve_local_dir
from .base import check_batch, torch_dtype, weights_version


class ClipScore:
    """CLIP cosine (or PickScore-scaled) scorer of a local CLIP checkpoint."""

    def __init__(
        self,
        path: str | Path,
        *,
        name: str = "clip_score",
        scale: str = "cosine",
        device: str = "cpu",
        dtype: str = "auto",
        batch_size: int = 64,
    ) -> None:
        from transformers import CLIPModel, CLIPProcessor

        if scale not in ("cosine", "logit"):
            raise ValueError(f"scale must be 'cosine' or 'logit', got {scale!r}")
        local = resolve_local_dir(path, name, required=("config.json",))
        self.dtype = torch_dtype(dtype, device)
        self.model = CLIPModel.from_pretrained(local, local_files_only=True, dtype=self.dtype)
        self.model = self.model.to(device).eval()
        self.processor = CLIPProcessor.from_pretrained(local, local_files_only=True)
        self.name = name
        self.scale = scale
        self.device = torch.device(device)
        self.batch_size = batch_size
        self.version = weights_version(local)

    def _pixels(self, images: np.ndarray) -> torch.Tensor:
        """Processor pixel values; images already at the crop size skip PIL (same values:
        resize and centre crop are identities there, only rescale + normalise remain)."""
        ip = self.processor.image_processor
        crop = getattr(ip, "crop_size", None) or {}
        side = images.shape[1]
        identity = (
            images.shape[1] == images.shape[2]
            and crop.get("height") == side == crop.get("width")
            and (getattr(ip, "size", None) or {}).get("shortest_edge") == side
        )
        if not identity:
            pil = [Image.fromarray(img) for img in images]
            return self.processor(images=pil, return_tensors="pt")["pixel_values"]
        x = torch.from_numpy(images).permute(0, 3, 1, 2).float() * float(ip.rescale_factor)
        mean = torch.tensor(ip.image_mean, dtype=torch.float32).view(1, 3, 1, 1)
        std = torch.tensor(ip.image_std, dtype=torch.float32).view(1, 3, 1, 1)
        return (x - mean) / std

    @torch.no_grad()
    def score(self, images, prompts: list[str]) -> np.ndarray:
        arr = check_batch(images, prompts)
        if arr.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        m = self.model
        # prompts repeat (a group shares one): embed each distinct prompt once
        unique = sorted(set(prompts))
        tokens = self.processor.tokenizer(
            unique, return_tensors="pt", padding=True, truncation=True
        ).to(self.device)
        text = m.text_projection(m.text_model(**tokens).pooler_output)
        text = text.float() / text.float().norm(dim=-1, keepdim=True)
        row = torch.tensor([unique.index(p) for p in prompts], device=self.device)
        out = []
        for lo in range(0, arr.shape[0], self.batch_size):
            pixels = self._pixels(arr[lo : lo + self.batch_size]).to(self.device, self.dtype)
            img = m.visual_projection(m.vision_model(pixel_values=pixels).pooler_output)
            img = img.float() / img.float().norm(dim=-1, keepdim=True)
            cos = (img * text[row[lo : lo + self.batch_size]]).sum(dim=-1)
            if self.scale == "logit":
                cos = cos * m.logit_scale.float().exp()
            out.append(cos.float().cpu())
        return torch.cat(out).numpy().astype(np.float32)
