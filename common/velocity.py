"""What every family's velocity adapter shares: a diffusers transformer called as the
engine's VelocityModel, ``(x, t, cond) → v``, float32 on both sides of a call that
computes in the adapter's dtype (``transformer_call.py``), with a count of calls; and,
for the families with classifier-free guidance (SD3, Qwen-Image), the guided call.

A guided call runs the prompt's rows and the negative prompt's in one batch, the way
both pipelines batch their two calls, and returns the family's combination of the two
predictions. That combined velocity is what the SDE step, its log-prob and the learner's
ratio see. The family supplies what differs: its text inputs, the order of the two
halves in the batch, the transformer's keyword arguments and timestep scale, and the
combination."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from .transformer_call import compute_dtype, sdpa_backends, transformer_call

NEGATIVE = "negative_"  # the prefix of a cond key of the negative prompt's embeddings


def uses_cfg(guidance: float | None) -> bool:
    """Whether a classifier-free guidance scale runs the negative prompt (≤ 1 or None: no)."""
    return guidance is not None and guidance > 1.0


class TransformerVelocity:
    """A transformer, the dtype its calls compute in, the SDPA backend they may use."""

    def __init__(
        self,
        transformer: Any,
        guidance: float | None,
        autocast_dtype: torch.dtype | None = None,
        attention_backend: str = "auto",
    ) -> None:
        self.transformer = transformer
        self.guidance = guidance
        self.autocast_dtype = autocast_dtype
        self.attention_backend = attention_backend
        sdpa_backends(attention_backend)  # an unknown backend is refused here, not at a call
        self.calls = 0

    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    def _compute_dtype(self) -> torch.dtype | None:
        return compute_dtype(self.transformer, self.autocast_dtype)

    def _forward(self, **inputs) -> torch.Tensor:
        """One transformer call; its prediction in float32."""
        self.calls += 1
        with transformer_call(self.device, self._compute_dtype(), self.attention_backend):
            return self.transformer(**inputs, return_dict=False)[0].to(torch.float32)


class GuidedVelocity(TransformerVelocity):
    """Classifier-free guidance of scale ``guidance`` in one batched call; ``guidance``
    ≤ 1 (or None) calls the model once, on the prompt's rows alone."""

    NEGATIVE_FIRST: ClassVar[bool]  # the negative prompt's rows lead the batch

    @property
    def guided(self) -> bool:
        return uses_cfg(self.guidance)

    def text_inputs(self, cond: Mapping[str, torch.Tensor], prefix: str) -> dict:
        """The prompt's (``prefix`` "") or the negative prompt's (``NEGATIVE``) text
        tensors, by the transformer's argument name; None for an absent optional one."""
        raise NotImplementedError

    def model_timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        """The timestep the transformer takes for σ."""
        return sigma

    def transformer_inputs(self, x: torch.Tensor, t: torch.Tensor, text: dict) -> dict:
        raise NotImplementedError

    def combine(self, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def __call__(
        self, x: torch.Tensor, timestep: torch.Tensor, cond: Mapping[str, torch.Tensor]
    ) -> torch.Tensor:
        device, f32 = self.device, torch.float32
        x, t = x.to(device, f32), self.model_timestep(timestep.to(device, f32))
        text = self.text_inputs(cond, "")
        if self.guided:
            negative = self.text_inputs(cond, NEGATIVE)
            for name, rows in text.items():
                if rows is not None:
                    pair = (negative[name], rows) if self.NEGATIVE_FIRST else (rows, negative[name])
                    text[name] = torch.cat(pair)
            x, t = torch.cat([x, x]), torch.cat([t, t])
        out = self._forward(**self.transformer_inputs(x, t, text))
        if not self.guided:
            return out
        first, second = out.chunk(2)
        negative, positive = (first, second) if self.NEGATIVE_FIRST else (second, first)
        return self.combine(positive, negative)
