"""What every family's components class shares (``families.py``): loading a local
pipeline directory as diffusers and transformers save one, the pipeline over the very
modules, inference mode, the device, and prompt encoding in chunks with the negative
prompt's rows for classifier-free guidance. A family's class (a dataclass with one
field per component) says which classes its components are and how one chunk of
prompts encodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch

from .loaders import resolve_local_dir
from .velocity import NEGATIVE, uses_cfg


class FamilyComponents:
    PIPELINE: ClassVar[str]  # diffusers' pipeline class, as model_index.json names it
    LABEL: ClassVar[str]  # the directory in errors: "FLUX pipeline"
    COMPONENTS: ClassVar[tuple[str, ...]]  # the modules, named as the pipeline's arguments
    NEGATIVE_PROMPT: ClassVar[str | None] = None  # classifier-free guidance's; None: no CFG
    # How a bare pipeline of the family is sampled where no run config says (``g2rpo
    # eval`` of a pipeline directory): ``model.guidance`` and the sampling fields
    SAMPLING: ClassVar[dict] = {}

    transformer: Any
    path: Path | None
    guidance: float | None = None  # the CFG scale encode_prompts prepares the negatives for

    @classmethod
    def sampling_guidance(cls, guidance: float | None) -> float:
        """``guidance``, or the family's own (``SAMPLING``) where the caller gives none."""
        return cls.SAMPLING["guidance"] if guidance is None else guidance

    @staticmethod
    def transformer_class():
        raise NotImplementedError

    @staticmethod
    def module_classes() -> dict[str, Any]:
        """The class of each component other than the transformer and tokenizers."""
        raise NotImplementedError

    @classmethod
    def pipeline_class(cls):
        import diffusers

        return getattr(diffusers, cls.PIPELINE)

    @classmethod
    def load(
        cls,
        path: str | Path,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        text_encoder_dtype: torch.dtype = torch.float32,
    ):
        """Every component from a local pipeline directory (never a hub). ``dtype``: the
        transformer's weights; ``text_encoder_dtype``: the text encoders' (T5-XXL is
        19 GB in float32); the VAE as saved."""
        from transformers import AutoTokenizer

        root = resolve_local_dir(path, cls.LABEL, required=("model_index.json",))
        for sub in cls.COMPONENTS:
            resolve_local_dir(root / sub, f"{cls.LABEL} component {sub!r}")
        kw = dict(local_files_only=True)
        classes = {"transformer": cls.transformer_class(), **cls.module_classes()}
        modules = {}
        for name in cls.COMPONENTS:
            if name.startswith("tokenizer"):
                modules[name] = AutoTokenizer.from_pretrained(root / name, **kw)
                continue
            if name == "transformer":
                module = classes[name].from_pretrained(
                    root, subfolder=name, torch_dtype=dtype, **kw
                )
            elif name == "vae":
                module = classes[name].from_pretrained(root, subfolder=name, **kw)
            else:  # a text encoder, saved by transformers
                module = classes[name].from_pretrained(root / name, dtype=text_encoder_dtype, **kw)
            modules[name] = module.to(device)
        return cls(**modules, path=root).for_inference()

    def as_pipeline(self, scheduler):
        """diffusers' pipeline over these very modules (its LoRA loader uses it)."""
        return self.pipeline_class()(
            scheduler=scheduler, **{name: getattr(self, name) for name in self.COMPONENTS}
        )

    def save(self, out: str | Path, scheduler) -> Path:
        """These modules saved as diffusers saves the family's pipeline, with ``scheduler``."""
        path = Path(out)
        self.as_pipeline(scheduler).save_pretrained(path)
        return path

    def for_inference(self):
        """Every model in eval mode without gradients. These components only sample
        (the learner builds its own transformer); a weight that requires grad would
        make autocast keep a low-precision copy of it for the whole forward."""
        for name in self.COMPONENTS:
            module = getattr(self, name)
            if isinstance(module, torch.nn.Module):
                module.eval().requires_grad_(False)
        return self

    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    def check_sequence_length(self, max_sequence_length: int) -> None:
        """Refuse a length the pipeline refuses (none by default)."""

    def _encode(self, prompts: list[str], max_sequence_length: int) -> dict:
        """One chunk of prompts' embeddings, as the pipeline's ``encode_prompt``."""
        raise NotImplementedError

    def encode_prompts(self, prompts: list[str], max_sequence_length: int, batch: int = 32) -> dict:
        """The pipeline's prompt embeddings in chunks of ``batch`` prompts (an evaluation's
        hundreds of prompts through T5-XXL at once would hold GiBs of activations), with
        the negative prompt's under ``negative_`` keys when ``guidance`` > 1."""
        if not prompts:
            raise ValueError("prompts: at least one prompt is needed")
        self.check_sequence_length(max_sequence_length)
        parts = [
            self._encode(prompts[lo : lo + batch], max_sequence_length)
            for lo in range(0, len(prompts), batch)
        ]
        out = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        if self.NEGATIVE_PROMPT is not None and uses_cfg(self.guidance):
            negative = self._encode([self.NEGATIVE_PROMPT], max_sequence_length)
            for k, v in negative.items():
                out[NEGATIVE + k] = v.expand(len(prompts), *v.shape[1:]).clone()
        return out
