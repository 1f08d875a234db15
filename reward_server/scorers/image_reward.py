"""``image_reward``: ImageReward from a directory ``g2rpo convert-reward image_reward``
wrote (ImageRewardModel + its BERT tokenizer + open_clip-style image processor).

Scores as ImageReward's ``inference_rank`` does: prompts padded to 35 tokens, every
image's tokens attended by its own prompt, the normalised MLP output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ...common.families.loaders import resolve_local_dir
from .base import check_batch, check_images, torch_dtype, weights_version


class ImageRewardScore:
    def __init__(
        self,
        path: str | Path,
        *,
        name: str = "image_reward",
        device: str = "cpu",
        dtype: str = "auto",
        batch_size: int = 32,
    ) -> None:
        from transformers import AutoTokenizer
        from transformers.models.clip import CLIPImageProcessorPil

        from .image_reward_model import ImageRewardModel

        local = resolve_local_dir(path, name, required=("config.json", "preprocessor_config.json"))
        self.dtype = torch_dtype(dtype, device)
        model = ImageRewardModel.from_pretrained(local, local_files_only=True, dtype=self.dtype)
        self.model = model.to(device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(local, local_files_only=True)
        self.image_processor = CLIPImageProcessorPil.from_pretrained(local, local_files_only=True)
        self.name = name
        self.device = torch.device(device)
        self.batch_size = batch_size
        self.version = weights_version(local)

    def _pixels(self, images: np.ndarray) -> torch.Tensor:
        pil = [Image.fromarray(img) for img in images]
        return self.image_processor(images=pil, return_tensors="pt")["pixel_values"]

    @torch.no_grad()
    def score(self, images, prompts: list[str]) -> np.ndarray:
        arr = check_batch(images, prompts)
        if arr.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        tokens = self.tokenizer(
            list(prompts),
            padding="max_length",
            truncation=True,
            max_length=self.model.config.prompt_tokens,
            return_tensors="pt",
        )
        out = []
        for lo in range(0, arr.shape[0], self.batch_size):
            hi = lo + self.batch_size
            pixels = self._pixels(arr[lo:hi]).to(self.device, self.dtype)
            reward = self.model(
                pixel_values=pixels,
                input_ids=tokens["input_ids"][lo:hi].to(self.device),
                attention_mask=tokens["attention_mask"][lo:hi].to(self.device),
            )
            out.append(reward.float().cpu())
        return torch.cat(out).numpy().astype(np.float32)

    @torch.no_grad()
    def embed(self, images) -> np.ndarray:
        """float32 [N, D]: BLIP's contrastive image feature (the vision tower's class
        token through ``vision_proj``, L2-normalised), which the reward itself does not use."""
        arr = check_images(images)
        m, out = self.model, []
        for lo in range(0, arr.shape[0], self.batch_size):
            pixels = self._pixels(arr[lo : lo + self.batch_size]).to(self.device, self.dtype)
            cls = m.vision_model(pixel_values=pixels).last_hidden_state[:, 0, :]
            feat = m.vision_proj(cls).float()
            out.append((feat / feat.norm(dim=-1, keepdim=True)).cpu())
        if not out:
            return np.zeros((0, m.config.embed_dim), np.float32)
        return torch.cat(out).numpy()
