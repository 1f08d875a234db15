"""LoRA adapters on a diffusers transformer through peft: attach, read, load
strictly, switch off (the KL reference), and save in the layout
``FluxPipeline.load_lora_weights`` reads."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from ..algorithms.seeds import seed_for
from ..config.model import LoraOptions
from ..config.run import G2RPOConfig
from ..errors import ConfigError

ADAPTER = "default"


class AdapterMismatch(ValueError):
    """Adapter weights whose names or shapes differ from the model's adapters."""


def add_lora(transformer: torch.nn.Module, options: LoraOptions, seed: int) -> torch.nn.Module:
    """Attach adapters in place; the base weights are frozen, only A and B train.
    B starts at zero, so the adapted model equals the base model until a step.
    A's random init is drawn from ``seed`` (not the global RNG), so a resumed or
    repeated run starts from the same adapters."""
    from peft import LoraConfig

    config = LoraConfig(
        r=options.rank,
        lora_alpha=options.alpha,
        target_modules=list(options.target_modules),
        init_lora_weights="gaussian" if options.init == "gaussian" else True,
        lora_dropout=0.0,  # dropout would make rollout and learner log-probs disagree
    )
    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            transformer.add_adapter(config, adapter_name=ADAPTER)
    except ValueError as exc:
        if "not found" not in str(exc):
            raise
        raise ConfigError(f"model.lora.target_modules {options.target_modules}: {exc}") from None
    # adapters on a bf16/fp16 base are created in its dtype; they train in fp32
    from peft.tuners.tuners_utils import cast_adapter_dtype

    cast_adapter_dtype(transformer, ADAPTER, autocast_adapter_dtype=True)
    return transformer


def adapter_state(transformer: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter weights only, under peft's adapter-free names (``...lora_A.weight``)."""
    from peft.utils import get_peft_model_state_dict

    state = get_peft_model_state_dict(transformer, adapter_name=ADAPTER)
    # one copy: a device tensor's .cpu() already copies, a CPU one must not alias
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def load_adapter_state(transformer: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load adapter weights, refusing any missing, unexpected or misshapen tensor
    (peft's own loader reports those but loads the rest)."""
    from peft.utils import set_peft_model_state_dict

    expected = {k: v.shape for k, v in adapter_state(transformer).items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    misshapen = sorted(k for k in set(expected) & set(state) if state[k].shape != expected[k])
    if missing or unexpected or misshapen:
        raise AdapterMismatch(
            f"adapter weights do not fit the model: missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}, misshapen {misshapen[:3]} (of {len(expected)} tensors)"
        )
    set_peft_model_state_dict(transformer, state, adapter_name=ADAPTER)


@contextmanager
def adapters_disabled(transformer: torch.nn.Module):
    """Run the base model: the reference policy of a LoRA run."""
    transformer.disable_adapters()
    try:
        yield
    finally:
        transformer.enable_adapters()


class BaseModelVelocity:
    """A velocity model evaluated with the adapters switched off."""

    def __init__(self, velocity) -> None:
        self.velocity = velocity

    def __call__(self, x, timestep, cond):
        with adapters_disabled(self.velocity.transformer):
            return self.velocity(x, timestep, cond)


def save_lora_weights(
    transformer: torch.nn.Module, directory: str | Path, pipeline_class=None
) -> Path:
    """Write ``pytorch_lora_weights.safetensors`` for the family pipeline's
    ``load_lora_weights`` (FluxPipeline's when none is named)."""
    if pipeline_class is None:
        from diffusers import FluxPipeline as pipeline_class

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # the adapter config travels in the file's metadata: without it diffusers would
    # assume alpha = r and load the adapters at the wrong scale
    pipeline_class.save_lora_weights(
        directory,
        transformer_lora_layers=adapter_state(transformer),
        transformer_lora_adapter_metadata=transformer.peft_config[ADAPTER].to_dict(),
    )
    return directory / "pytorch_lora_weights.safetensors"


def attach_lora(transformer: torch.nn.Module, cfg: G2RPOConfig) -> None:
    """The run's adapters (if ``model.lora``), initialised from ``run.seed`` alone, so
    the learner, every worker and a resumed run build the same ones."""
    if cfg.model.lora is not None:
        add_lora(transformer, cfg.model.lora, seed_for(cfg.run.seed, 0, 0, 2))
