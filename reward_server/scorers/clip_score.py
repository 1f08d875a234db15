"""CLIP-family scorers through ``transformers.CLIPModel``/``CLIPProcessor`` from a local dir.

``clip_score``: cosine similarity of the image and prompt embeddings (the DFN5B
score of G²RPO's HPS&CLIP setting). ``pickscore``: the same cosine times
exp(logit_scale), PickScore's scale (≈ 22 for real checkpoints).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from cachetools import LRUCache
from PIL import Image

from ...common.families.loaders import resolve_local_dir
from .base import check_batch, check_images, torch_dtype, weights_version

# A score must not depend on the company its image came in: the server's dynamic
# batcher merges whichever requests arrive together, so the same image is scored in a
# call of 1 image in one run and of 2 in its resumed or restarted twin. Matrix kernels
# pick their blocking by the number of rows, and on CPU a call of 1–3 images of the
# tiny world's CLIP gave scores 1e-7 away from the same images in a larger call, while
# every call of 4 or more gave the same bits (measured 2026-11-26). So a vision call
# has at least MIN_IMAGE_ROWS rows (the last image repeated), and each prompt is
# embedded alone, never padded to the longest prompt of its request.
MIN_IMAGE_ROWS = 8
PROMPT_CACHE_SIZE = 4096


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
        self.batch_size = max(batch_size, MIN_IMAGE_ROWS)
        self.version = weights_version(local)
        self._prompts: LRUCache = LRUCache(PROMPT_CACHE_SIZE)  # prompt → unit embedding

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

    def _prompt_embedding(self, prompt: str) -> torch.Tensor:
        """The prompt's unit text embedding, computed alone (its own length, no padding)."""
        cached = self._prompts.get(prompt)
        if cached is None:
            m = self.model
            tokens = self.processor.tokenizer([prompt], return_tensors="pt", truncation=True)
            text = m.text_projection(m.text_model(**tokens.to(self.device)).pooler_output)[0]
            cached = text.float() / text.float().norm()
            self._prompts[prompt] = cached
        return cached

    @torch.no_grad()
    def score(self, images, prompts: list[str]) -> np.ndarray:
        arr = check_batch(images, prompts)
        if arr.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        m = self.model
        # prompts repeat (a group shares one): each distinct prompt embedded once, alone
        unique = sorted(set(prompts))
        text = torch.stack([self._prompt_embedding(p) for p in unique])
        row = torch.tensor([unique.index(p) for p in prompts], device=self.device)
        out = []
        for lo in range(0, arr.shape[0], self.batch_size):
            img = self._unit_image_features(arr[lo : lo + self.batch_size])
            cos = (img * text[row[lo : lo + len(img)]]).sum(dim=-1)
            if self.scale == "logit":
                cos = cos * m.logit_scale.float().exp()
            out.append(cos.float().cpu())
        return torch.cat(out).numpy().astype(np.float32)

    def _unit_image_features(self, chunk: np.ndarray) -> torch.Tensor:
        """float32 [n, D] unit image embeddings of at most ``batch_size`` images."""
        m, n = self.model, len(chunk)
        if n < MIN_IMAGE_ROWS:  # padded: the same kernels as in any larger call
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], MIN_IMAGE_ROWS - n, 0)])
        pixels = self._pixels(chunk).to(self.device, self.dtype)
        img = m.visual_projection(m.vision_model(pixel_values=pixels).pooler_output)[:n]
        return img.float() / img.float().norm(dim=-1, keepdim=True)

    @torch.no_grad()
    def embed(self, images) -> np.ndarray:
        """float32 [N, D]: the unit image embeddings the score takes its cosine of."""
        arr = check_images(images)
        dim = self.model.config.projection_dim
        parts = [
            self._unit_image_features(arr[lo : lo + self.batch_size]).cpu()
            for lo in range(0, arr.shape[0], self.batch_size)
        ]
        return torch.cat(parts).numpy() if parts else np.zeros((0, dim), np.float32)
