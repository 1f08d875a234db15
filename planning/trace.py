"""Activation memory of the models a run holds, traced on fake tensors.

Each trace builds the module under ``FakeTensorMode`` (no storage is allocated, no
arithmetic runs) and runs it under torch's ``MemTracker``, which accounts every
storage the dispatcher creates. What we keep is the peak of the memory that is
neither parameters, gradients nor optimizer state: saved activations, autograd
temporaries, the autocast cache. The transformer is traced at reduced depth and
extrapolated linearly in its block counts (one forward saves per block), which keeps
a FLUX.1-dev plan at a few seconds per distinct shape; results are cached on disk.

The traces of the plans README and the shipped FLUX recipes need (their remedies
included) ship with the package (``presets/traces.json``, written by
``python -m g2rpo.planning.ship_traces``): those plans answer at once instead of in
30-45 s of tracing on a fresh machine. A shape not among them is traced as before.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from functools import lru_cache
from importlib import resources
from pathlib import Path

import torch
from torch.distributed._tools.mem_tracker import MemTracker

from ..common.families.flux import FluxVelocity
from .presets import transformer_family

CACHE_VERSION = 2  # 2: each cache file holds its key text beside the result
_PARAM_KINDS = ("Parameter", "Gradient", "Optstate", "Buffer", "Total")


class ActivationPeakTracker(MemTracker):
    """MemTracker that also keeps the peak of everything but weights, gradients and
    optimizer state (what a forward/backward adds on top of the model)."""

    def __init__(self, grads: bool = True) -> None:
        super().__init__()
        self.transient_peak = 0
        self.grads = grads

    def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
        # frozen weights (inference) cannot take gradient hooks
        return super()._track_module_params_and_buffers(module, install_grad_hooks and self.grads)

    def _pre_fw_hook(self, module, inputs) -> None:
        # a rollout calls the same modules many times; per-module stats are not used
        if module in self.memory_tracking and not self._mod_tracker.is_bw:
            del self.memory_tracking[module]
        super()._pre_fw_hook(module, inputs)

    def _update_peak_stats(self, peak_state) -> None:
        super()._update_peak_stats(peak_state)
        for snap in self._curr_mem_snap.values():
            extra = sum(v for k, v in snap.items() if k not in _PARAM_KINDS)
            self.transient_peak = max(self.transient_peak, extra)


def cache_dir() -> Path:
    root = os.environ.get("G2RPO_PLAN_CACHE") or Path.home() / ".cache" / "g2rpo" / "plan"
    return Path(root)


SHIPPED = "traces.json"  # in planning/presets/


@lru_cache(maxsize=1)
def shipped_traces() -> dict[str, dict]:
    """The traces that ship with the package: key text → result (empty when the
    environment sets G2RPO_PLAN_SHIPPED=0, as ship_traces does to trace them anew)."""
    if os.environ.get("G2RPO_PLAN_SHIPPED") == "0":
        return {}
    try:
        text = resources.files(__package__).joinpath("presets", SHIPPED).read_text()
    except FileNotFoundError:
        return {}
    return {entry["key"]: entry["result"] for entry in json.loads(text)["traces"]}


def cache_key(kind: str, key: dict) -> str:
    return json.dumps({"kind": kind, "v": CACHE_VERSION, **key}, sort_keys=True)


def cached(kind: str, key: dict, compute) -> dict:
    """``compute()`` once per distinct ``key`` (a JSON-able dict): a shipped trace,
    else one kept on disk, else traced now and kept."""
    text = cache_key(kind, key)
    shipped = shipped_traces().get(text)
    if shipped is not None:
        return dict(shipped)
    path = cache_dir() / f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:20]}.json"
    try:
        entry = json.loads(path.read_text())
        if entry["key"] == text:
            return entry["result"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    result = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": text, "result": result}))
    except OSError:
        pass  # a read-only home: plan without the cache
    return result


@contextmanager
def default_dtype(dtype: torch.dtype):
    """Build modules in ``dtype`` (``Module.to`` cannot swap fake parameters)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def build_at(config: dict, depth: dict):
    """The family's transformer of ``config`` with ``depth``'s block counts."""
    from .presets import build_component

    return build_component("transformer", {**config, **depth})


def build_transformer(config: dict, layers: int, single: int):
    """A FLUX transformer of ``config`` with (double, single) blocks."""
    return build_at(config, {"num_layers": layers, "num_single_layers": single})


SD3_CLIP_TOKENS = 77  # SD3's CLIP-L and CLIP-G states lead its text sequence


def transformer_inputs(config: dict, batch: int, latent_hw: tuple[int, int], text_tokens: int):
    """A transformer call's inputs: FLUX's packed tokens, or SD3's [B, C, h, w] latent
    and its CLIP + T5 sequence (``text_tokens`` of T5 after CLIP's 77)."""
    h, w = latent_hw
    family = transformer_family(config)
    if family == "sd3":
        x = torch.randn(batch, config["in_channels"], h, w)
        text_tokens += SD3_CLIP_TOKENS
    else:
        x = torch.randn(batch, (h // 2) * (w // 2), config["in_channels"])
    t = torch.rand(batch)
    cond = {"encoder_hidden_states": torch.randn(batch, text_tokens, config["joint_attention_dim"])}
    if family != "qwenimage":  # Qwen-Image: no mask, every row used (a full prompt's call)
        cond["pooled_projections"] = torch.randn(batch, config["pooled_projection_dim"])
    return x, t, cond


def velocity_of(model, config: dict, latent_hw, autocast_dtype, guided: bool = False):
    """The family's velocity adapter, as the rollout and the learner call the model
    (SD3 with classifier-free guidance runs the empty prompt's rows beside each)."""
    family = transformer_family(config)
    if family == "sd3":
        from ..common.families.sd3_pipeline import SD3Components, SD3Velocity

        scale = SD3Components.SAMPLING["guidance"] if guided else 1.0
        return SD3Velocity(model, scale, autocast_dtype)
    if family == "qwenimage":
        from ..common.families.qwenimage_pipeline import QwenImageComponents, QwenImageVelocity

        scale = QwenImageComponents.SAMPLING["guidance"] if guided else 1.0
        return QwenImageVelocity(model, *latent_hw, scale, autocast_dtype)
    from ..common.families.flux_pipeline import FluxComponents

    guidance = FluxComponents.SAMPLING["guidance"]  # an input of the model, not CFG
    return FluxVelocity(model, *latent_hw, guidance=guidance, autocast_dtype=autocast_dtype)


def guided_cond(cond: dict) -> dict:
    """``cond`` with the negative prompt's rows a guided call (SD3, Qwen-Image) also
    takes (both families name them ``negative_``)."""
    from ..common.families.velocity import NEGATIVE

    return {**cond, **{NEGATIVE + k: torch.randn_like(v) for k, v in cond.items()}}


def trace_transformer_once(
    config: dict,
    layers: int,
    single: int,
    *,
    batch: int,
    latent_hw: tuple[int, int],
    text_tokens: int,
    weights_dtype: str,
    autocast_dtype: str | None,
    train: bool,
    checkpointing: bool,
    lora: dict | None,
    guided: bool = False,
    depth: dict | None = None,
) -> int:
    """Peak transient bytes of one call; ``depth`` (block counts) overrides the FLUX
    (``layers``, ``single``) pair for other families."""
    depth = depth or {"num_layers": layers, "num_single_layers": single}
    with _fake_mode():
        with default_dtype(getattr(torch, weights_dtype)):
            model = build_at(config, depth)
        if lora is not None:
            from ..common.config.model import LoraOptions
            from ..common.families.lora import add_lora

            add_lora(model, LoraOptions(**lora), 0)
        if not train:
            model.requires_grad_(False).eval()
        elif checkpointing:
            model.enable_gradient_checkpointing()
        autocast = getattr(torch, autocast_dtype) if autocast_dtype else None
        velocity = velocity_of(model, config, latent_hw, autocast, guided)
        x, t, cond = transformer_inputs(config, batch, latent_hw, text_tokens)
        if guided:
            cond = guided_cond(cond)
        tracker = ActivationPeakTracker(grads=train)
        tracker.track_external(model)
        with tracker:
            if train:
                velocity(x, t, cond).square().mean().backward()
            else:
                with torch.no_grad():  # MemTracker's hooks need no_grad, not inference_mode
                    velocity(x, t, cond)
    return tracker.transient_peak


# depths traced; FLUX-size extrapolation solves base + layers·a_double + single·a_single
_DEPTHS = ((1, 1), (2, 1), (1, 2))


def depth_variants(config: dict) -> list[dict]:
    """The three small depths a transformer is traced at. FLUX: (double, single) blocks
    (1, 1), (2, 1), (1, 2). SD3: 1 and 2 layers, then 2 with the first one's dual
    attention (SD3.5's MMDiT-X layers 0-12 attend twice); its last layer is always the
    context-pre-only one, so the difference of 1 and 2 layers is one ordinary layer."""
    if transformer_family(config) == "sd3":
        return [
            {"num_layers": 1, "dual_attention_layers": []},
            {"num_layers": 2, "dual_attention_layers": []},
            {"num_layers": 2, "dual_attention_layers": [0]},
        ]
    if transformer_family(config) == "qwenimage":  # one kind of layer (two would do)
        return [{"num_layers": n} for n in (1, 2, 3)]
    return [{"num_layers": a, "num_single_layers": b} for a, b in _DEPTHS]


def solve_depth(values: list[int], config: dict) -> dict:
    """The full depth's figure from the three traced ones (``depth_variants``): each
    block adds the same, so the solution is exact for FLOPs and linear for memory."""
    v1, v2, v3 = values
    if transformer_family(config) == "qwenimage":
        per_layer, base = v2 - v1, 2 * v1 - v2
        total = base + per_layer * config["num_layers"]
        return {"bytes": total, "per_layer": per_layer, "base": base}
    if transformer_family(config) == "sd3":
        per_layer, per_dual = v2 - v1, v3 - v2
        base = v1 - per_layer
        dual = len(config.get("dual_attention_layers") or ())
        total = base + per_layer * config["num_layers"] + per_dual * dual
        return {"bytes": total, "per_layer": per_layer, "per_dual": per_dual, "base": base}
    per_double, per_single = v2 - v1, v3 - v1
    base = v1 - per_double - per_single
    total = base + per_double * config["num_layers"] + per_single * config["num_single_layers"]
    return {"bytes": total, "per_double": per_double, "per_single": per_single, "base": base}


def transformer_activations(config: dict, **shape) -> dict:
    """Peak transient bytes of one transformer call (``shape``: batch, latent_hw,
    text_tokens, weights_dtype, autocast_dtype, train, checkpointing, lora), at the
    config's depth: {"bytes": int, "per_double": int, "per_single": int, "base": int}."""
    arch = {k: v for k, v in config.items() if not k.startswith("_")}

    variants = depth_variants(arch)

    def compute() -> dict:
        if not shape["train"]:  # no grad: one block's temporaries at a time
            if transformer_family(arch) == "sd3":  # a dual-attention layer, the largest
                peak = trace_transformer_once(config, 1, 1, depth=variants[2], **shape)
                return {"bytes": peak, "base": peak}
            if transformer_family(arch) == "qwenimage":
                peak = trace_transformer_once(config, 1, 1, depth=variants[0], **shape)
                return {"bytes": peak, "base": peak}
            peak = trace_transformer_once(config, 1, 1, **shape)
            return {"bytes": peak, "per_double": 0, "per_single": 0, "base": peak}
        peaks = [trace_transformer_once(config, 1, 1, depth=d, **shape) for d in variants]
        return solve_depth(peaks, arch)

    key = {"arch": arch, **shape, "latent_hw": list(shape["latent_hw"])}
    return cached("transformer", key, compute)


def vae_and_latent(arch: dict, latent_hw: tuple[int, int]):
    """A VAE of ``arch`` for inference and one image's latent (in the current mode:
    callers trace on fake tensors): [1, C, h, w], or Qwen-Image's one-frame video
    latent [1, C, 1, h, w]."""
    from .presets import build_component

    vae = build_component("vae", arch).eval().requires_grad_(False)
    if "temperal_downsample" in arch:
        return vae, torch.randn(1, arch["z_dim"], 1, *latent_hw)
    return vae, torch.randn(1, arch["latent_channels"], *latent_hw)


def vae_decode_activations(vae_config: dict, latent_hw: tuple[int, int]) -> int:
    """Peak transient bytes of decoding ONE image (fp32, no grad); a decode call of
    n images holds n times as much."""
    arch = {k: v for k, v in vae_config.items() if not k.startswith("_")}

    def compute() -> dict:
        with _fake_mode():
            vae, z = vae_and_latent(arch, latent_hw)
            tracker = ActivationPeakTracker(grads=False)
            tracker.track_external(vae)
            with tracker, torch.inference_mode():
                vae.decode(z, return_dict=False)
        return {"bytes": tracker.transient_peak}

    return cached("vae", {"arch": arch, "latent_hw": list(latent_hw)}, compute)["bytes"]
