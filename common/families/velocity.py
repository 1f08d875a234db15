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
from contextlib import nullcontext
from typing import Any, ClassVar

import torch

from .transformer_call import compute_dtype, sdpa_backends, transformer_call
from .transformer_compile import (
    call_stance,
    compile_blocks,
    graphs_compiled,
    mark_cuda_graph_step,
    release_trace_references,
)

NEGATIVE = "negative_"  # the prefix of a cond key of the negative prompt's embeddings


def uses_cfg(guidance: float | None) -> bool:
    """Whether a classifier-free guidance scale runs the negative prompt (≤ 1 or None: no)."""
    return guidance is not None and guidance > 1.0


class TransformerVelocity:
    """A transformer, the dtype its calls compute in, the SDPA backend they may use;
    for a rollout (``for_rollout``), its compiled blocks and its measured kernel."""

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
        self.compile = "none"  # model.compile, set by for_rollout
        self.measure_attention = False  # model.rollout_attention_backend fastest
        self.attention_times: dict[str, float | None] | None = None  # seconds per kernel
        self.attention_shape = None  # the AttentionShape they were timed at

    def for_rollout(self, compile: str = "none", attention: str = "same"):
        """This adapter as a rollout worker samples with it: its transformer's repeated
        blocks compiled (``model.compile``) and its SDPA kernels
        (``model.rollout_attention_backend``: same, fastest, or a backend name). The
        learner's adapter never gets these. Returns self."""
        if attention not in ("same", "fastest"):
            sdpa_backends(attention)
            self.attention_backend = attention
        self.measure_attention = attention == "fastest"
        compile_blocks(self.transformer, compile)
        self.compile = compile
        return self

    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    def _compute_dtype(self) -> torch.dtype | None:
        return compute_dtype(self.transformer, self.autocast_dtype)

    def _forward(self, **inputs) -> torch.Tensor:
        """One transformer call; its prediction in float32."""
        self.calls += 1
        if self.measure_attention and self.attention_times is None:
            self._choose_attention(inputs)  # before a compiled block traces its kernel
        if self.compile == "blocks_cuda_graphs":
            mark_cuda_graph_step()
        compiled = self.compile != "none"
        graphs = graphs_compiled() if compiled else 0
        with (
            transformer_call(self.device, self._compute_dtype(), self.attention_backend),
            call_stance() if compiled else nullcontext(),
        ):
            out = self.transformer(**inputs, return_dict=False)[0].to(torch.float32)
        if compiled and graphs_compiled() != graphs:
            release_trace_references()  # this call compiled: the offload must still swap
        return out

    def _choose_attention(self, inputs: dict) -> None:
        """Time every SDPA kernel at this call's first attention shape and sample with
        the fastest from here on (``attention_choice``)."""
        from .attention_choice import fastest, first_attention_shape, time_kernels

        with transformer_call(self.device, self._compute_dtype(), self.attention_backend):
            shape = first_attention_shape(lambda: self.transformer(**inputs, return_dict=False))
        self.attention_times = {} if shape is None else time_kernels(shape)
        self.attention_shape = shape
        if shape is not None:
            self.attention_backend = fastest(self.attention_times)

    def attention_record(self) -> dict:
        """The rollout's SDPA kernels and, when measured, what chose them (for a bench's
        or a doctor's JSON)."""
        record: dict = {"attention_backend": self.attention_backend}
        if self.attention_times is not None:
            record["attention_ms"] = {
                n: None if t is None else round(t * 1e3, 4) for n, t in self.attention_times.items()
            }
            if self.attention_shape is not None:
                record["attention_shape"] = self.attention_shape.as_dict()
        return record


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
