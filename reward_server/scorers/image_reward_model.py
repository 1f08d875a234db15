"""ImageReward (Xu et al. 2023) as a transformers model: BLIP's ViT image encoder
(``BlipVisionModel``), BLIP's BERT text encoder with cross-attention to the image
tokens (``BlipTextModel``, run bidirectionally as BLIP's ``text_encoder`` is), and
the reward head on the [CLS] state: five Linear layers without activations
(768→1024→128→64→16→1; dropouts in between at training time), then the published
normalisation (r − 0.16717362830052426) / 1.0333394966054072.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import (
    BlipTextConfig,
    BlipVisionConfig,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.models.blip.modeling_blip import BlipVisionModel
from transformers.models.blip.modeling_blip_text import BlipTextModel

REWARD_MEAN = 0.16717362830052426
REWARD_STD = 1.0333394966054072
HEAD_WIDTHS = (1024, 128, 64, 16, 1)
HEAD_DROPOUT = (0.2, 0.2, 0.1, 0.0)


class ImageRewardConfig(PretrainedConfig):
    model_type = "g2rpo_image_reward"

    def __init__(
        self,
        vision_config: dict | None = None,
        text_config: dict | None = None,
        embed_dim: int = 256,
        head_widths: list[int] | tuple[int, ...] = HEAD_WIDTHS,
        reward_mean: float = REWARD_MEAN,
        reward_std: float = REWARD_STD,
        prompt_tokens: int = 35,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.vision_config = dict(vision_config or {})
        self.text_config = dict(text_config or {})
        self.embed_dim = embed_dim
        self.head_widths = list(head_widths)
        self.reward_mean = reward_mean
        self.reward_std = reward_std
        self.prompt_tokens = prompt_tokens


def _reward_head(width: int, widths: list[int]) -> nn.Sequential:
    """ImageReward's MLP with its original module indices (Linear at 0, 2, 4, 6, 7)."""
    layers: list[nn.Module] = []
    for i, out in enumerate(widths):
        layers.append(nn.Linear(width, out))
        if i < len(HEAD_DROPOUT) and HEAD_DROPOUT[i] > 0:
            layers.append(nn.Dropout(HEAD_DROPOUT[i]))
        width = out
    return nn.Sequential(*layers)


class ImageRewardModel(PreTrainedModel):
    config_class = ImageRewardConfig
    base_model_prefix = "image_reward"
    main_input_name = "pixel_values"

    def __init__(self, config: ImageRewardConfig) -> None:
        super().__init__(config)
        vision = BlipVisionConfig(**config.vision_config)
        # is_decoder=True is what gives BlipTextLayer its cross-attention; forward()
        # still runs the encoder bidirectionally (is_decoder=False there)
        text = BlipTextConfig(**{**config.text_config, "is_decoder": True})
        self.vision_model = BlipVisionModel(vision)
        self.text_encoder = BlipTextModel(text, add_pooling_layer=False)
        # BLIP's contrastive projections: in the checkpoint, unused by the reward
        self.vision_proj = nn.Linear(vision.hidden_size, config.embed_dim)
        self.text_proj = nn.Linear(text.hidden_size, config.embed_dim)
        self.head = _reward_head(text.hidden_size, config.head_widths)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        pass  # weights always come from a converted checkpoint

    def forward(
        self,
        pixel_values: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Normalised rewards [N] for N (image, prompt) pairs."""
        image_embeds = self.vision_model(pixel_values=pixel_values).last_hidden_state
        image_mask = image_embeds.new_ones(image_embeds.shape[:2], dtype=torch.long)
        text = self.text_encoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            encoder_hidden_states=image_embeds,
            encoder_attention_mask=image_mask,
            is_decoder=False,
        ).last_hidden_state
        reward = self.head(text[:, 0, :].float().to(self.head[0].weight.dtype)).squeeze(-1)
        return (reward.float() - self.config.reward_mean) / self.config.reward_std
