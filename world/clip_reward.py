"""``shapes_clip``: a small transformers CLIPModel trained contrastively on the world,
saved with save_pretrained and scored through the generic CLIP-score scorer."""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from ..common.prompts.shapes import all_combinations, render_batch
from .text import MAX_TOKENS, TEXT_DIM, clip_text_kwargs

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def build_clip_reward(vocab_size: int, image_size: int = 32, seed: int = 0):
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(seed)
    text = clip_text_kwargs(vocab_size)
    vision = dict(
        hidden_size=TEXT_DIM,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=image_size,
        patch_size=4,
    )
    return CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=TEXT_DIM))


def build_processor(tokenizer, image_size: int = 32):
    from transformers import CLIPProcessor
    from transformers.models.clip import CLIPImageProcessorPil  # no torchvision here

    images = CLIPImageProcessorPil(
        size={"shortest_edge": image_size},
        crop_size={"height": image_size, "width": image_size},
        image_mean=list(CLIP_MEAN),
        image_std=list(CLIP_STD),
    )
    return CLIPProcessor(image_processor=images, tokenizer=tokenizer)


def pixel_values(images: np.ndarray) -> torch.Tensor:
    """The processor's normalisation for images already at the model's size (fast path)."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
    mean = torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CLIP_STD).view(1, 3, 1, 1)
    return (x - mean) / std


def train_clip_reward(
    tokenizer, *, steps: int, seed: int, batch: int = 128, lr: float = 1e-3, progress: bool = True
):
    """Symmetric InfoNCE over batches of distinct prompt combinations (all 280: a reward
    model, like HPS, is trained on broad data), each with a fresh random render."""
    model = build_clip_reward(len(tokenizer), seed=seed)
    combos = all_combinations()
    prompt_ids = tokenizer(
        [c.prompt for c in combos],
        padding="max_length",
        max_length=MAX_TOKENS,
        return_tensors="pt",
    ).input_ids
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    model.train()
    bar = tqdm(range(steps), desc="shapes_clip", disable=not progress)
    for step in bar:
        for group in opt.param_groups:  # cosine decay
            group["lr"] = lr * 0.5 * (1 + np.cos(np.pi * step / steps))
        pick = rng.choice(len(combos), size=min(batch, len(combos)), replace=False)
        imgs = render_batch([combos[i] for i in pick], seed=int(rng.integers(1 << 31)))
        out = model(input_ids=prompt_ids[pick], pixel_values=pixel_values(imgs))
        target = torch.arange(len(pick))
        loss = (
            torch.nn.functional.cross_entropy(out.logits_per_image, target)
            + torch.nn.functional.cross_entropy(out.logits_per_text, target)
        ) / 2
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    return model.eval()
