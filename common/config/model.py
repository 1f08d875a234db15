"""``model``: which pipeline a run loads, its dtype, LoRA, guidance and
how the rollout runs it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from ..errors import ConfigError
from .section import Section

FLUX_LORA_TARGETS = [
    "to_q",
    "to_k",
    "to_v",
    "to_out.0",
    "add_q_proj",
    "add_k_proj",
    "add_v_proj",
    "to_add_out",
]


class LoraOptions(Section):
    """Train low-rank adapters (peft) instead of the whole transformer; the learner
    then publishes, checkpoints and exports the adapters only."""

    rank: int = Field(32, ge=1, description="r")
    alpha: float = Field(64.0, gt=0, description="scale = alpha / r")
    target_modules: list[str] = Field(
        default_factory=lambda: list(FLUX_LORA_TARGETS),
        description="module names (suffixes) that get adapters: FLUX attention projections",
    )
    init: Literal["gaussian", "default"] = Field(
        "gaussian", description="A's init (B starts at zero, so step 0 is the base model)"
    )

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("needs at least one module name")
        return v


class ModelConfig(Section):
    pretrained: str | None = Field(
        None,
        description="Local diffusers pipeline directory; None = the built-in random test model",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="compute dtype: the transformer runs under autocast in it while its "
        "weights stay float32 (the official code's fp32 master weights + bf16 autocast)",
    )
    device: str = "cpu"
    guidance: float = Field(
        3.5,
        description="FLUX: the distilled guidance embedding's value; SD3: the classifier-free "
        "guidance scale (4.5 in SD3.5-Medium's recipes; <= 1 runs the model once a call, "
        "without the empty prompt)",
    )
    quantize_timestep: bool = Field(True, description="feed floor(1000σ)/1000 as the official code")
    lora: LoraOptions | None = Field(None, description="train LoRA adapters; None = full")
    rollout_weights_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="the dtype rollout workers hold published weights in (they never train): "
        "bfloat16 halves the bytes pushed and their memory, under model.dtype bfloat16; the "
        "learner keeps float32 master weights either way",
    )
    mixed_precision: Literal["autocast", "fsdp"] = Field(
        "autocast",
        description="how the learner computes in model.dtype: autocast over float32 weights, "
        "or FSDP2's mixed-precision policy (parameters gathered in model.dtype, gradients "
        "reduced in float32; full fine-tunes only)",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="the learner recomputes each transformer block's activations in the "
        "backward instead of saving them (diffusers' enable_gradient_checkpointing): the same "
        "gradients for ~1/40 of the activation memory at FLUX.1-dev size, ~1 more forward",
    )
    attention_backend: Literal["auto", "flash", "efficient", "cudnn", "math"] = Field(
        "auto",
        description="torch SDPA kernels the transformer may use. auto: every kernel but "
        "cuDNN's (its fused attention backward crashed a learner on an H100 with "
        "torch 2.11 / cuDNN 9.19); cudnn: cuDNN only; flash, efficient, math: that kernel only",
    )
    compile: Literal["none", "blocks", "blocks_cuda_graphs"] = Field(
        "none",
        description="the rollout workers' transformer (never the learner's): none runs it "
        "eagerly; blocks compiles each repeated transformer block with torch.compile "
        "(regional compilation, diffusers' compile_repeated_blocks: one compile per block "
        "class, shared by all its blocks, paid in the first rollout); blocks_cuda_graphs also "
        "replays each block as a CUDA graph (torch.compile mode reduce-overhead): CUDA only",
    )
    rollout_attention_backend: Literal[
        "same", "fastest", "auto", "flash", "efficient", "cudnn", "math"
    ] = Field(
        "same",
        description="the SDPA kernels of the rollout workers' transformer: same is "
        "model.attention_backend; fastest times every kernel forward-only at the rollout's "
        "first attention shape on the worker's device (its GPU, or the CPU) and samples with "
        "the fastest that runs; a name: that value of model.attention_backend. The learner "
        "keeps model.attention_backend (its recompute then runs another kernel: rounding)",
    )

    @model_validator(mode="after")
    def _cuda_graphs_on_cuda(self) -> ModelConfig:
        if self.compile == "blocks_cuda_graphs" and not self.device.startswith("cuda"):
            raise ValueError(
                f"model.compile blocks_cuda_graphs: CUDA graphs exist on CUDA devices only and "
                f"model.device is {self.device}: use model.compile blocks (or none) there"
            )
        return self

    @model_validator(mode="after")
    def _precision(self) -> ModelConfig:
        if self.rollout_weights_dtype == "bfloat16":
            if self.dtype != "bfloat16":
                raise ValueError(
                    "model.rollout_weights_dtype bfloat16 needs model.dtype bfloat16 (the "
                    f"rollout computes in model.dtype; got {self.dtype})"
                )
            if self.lora is not None:
                raise ValueError(
                    "model.rollout_weights_dtype bfloat16 is for a full fine-tune's published "
                    "weights; a LoRA run (model.lora) already holds its base in model.dtype "
                    "and publishes its adapters in float32"
                )
        if self.mixed_precision == "fsdp":
            if self.lora is not None:
                raise ValueError(
                    "model.mixed_precision fsdp shards a full fine-tune; a LoRA run "
                    "(model.lora) holds its base in model.dtype already: use autocast"
                )
            if self.dtype == "float32":
                raise ValueError(
                    "model.mixed_precision fsdp computes in model.dtype, which is float32: "
                    "there is nothing to mix (set model.dtype bfloat16, or use autocast; "
                    "train.learner.count > 1 shards with FSDP2 either way)"
                )
        return self

    def check_trainable(self) -> None:
        if self.dtype == "float16":
            raise ConfigError(
                "model.dtype float16: training needs loss scaling, which g2rpo does not do; "
                "use bfloat16 (or float32)"
            )

    def base_weights_dtype(self):
        """Trained weights stay float32 (master weights; compute is autocast to
        ``dtype``). A LoRA run never trains the base, so it is held in ``dtype``."""
        import torch

        return getattr(torch, self.dtype) if self.lora is not None else torch.float32

    def rollout_weights_torch_dtype(self):
        """The dtype of the rollout workers' transformer: a LoRA run's base is held in
        ``dtype``; a full fine-tune's published weights in ``rollout_weights_dtype``."""
        import torch

        if self.lora is not None:
            return self.base_weights_dtype()
        return getattr(torch, self.rollout_weights_dtype)

    def autocast_dtype(self):
        """None for float32, else the torch dtype the transformer computes in."""
        import torch

        return None if self.dtype == "float32" else getattr(torch, self.dtype)
