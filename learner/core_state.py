"""What a learner core saves and restores: the one-file checkpoint (a single learner, a
data-parallel rank 0), a sharded group's checkpoint, and the final export in diffusers'
layouts. A mixin of ``LearnerCore`` (learner/trainer.py), whose state it reads."""

from __future__ import annotations

from pathlib import Path

import torch

from ..common.errors import RunDirError
from ..common.families.lora import load_adapter_state
from ..common.families.registry import family_class
from .checkpoints import (
    full_weights,
    is_sharded_checkpoint,
    load_full_into_shards,
    load_sharded,
    save_sharded,
)
from .distributed import checkpoint_group
from .optimizer import keep_kernel


class SavedState:
    """``LearnerCore``'s checkpoints and export (the core's transformer, optimizer,
    objective, version and iteration)."""

    def state_dict(self) -> dict:
        """A one-file checkpoint (a single learner, or a data-parallel rank 0)."""
        state = {
            "lora" if self.lora else "transformer": self.trained_state(),
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "iteration": self.iteration,
        }
        state.update(self.objective.state())
        return state

    def save(self, path: str) -> None:
        """A sharded group writes its shards (every rank); otherwise rank 0 writes
        one file."""
        self.resident()
        if self.sharded:
            meta = {"version": self.version, "iteration": self.iteration, "kind": "transformer"}
            save_sharded(self.transformer, self.optimizer, path, meta, checkpoint_group())
        elif self.share.rank == 0:
            torch.save(self.state_dict(), path)

    def load(self, path: str) -> int:
        """Either checkpoint layout into this learner, whatever group wrote it (in a
        sharded group a one-file checkpoint is read by rank 0 and broadcast)."""
        self.resident()
        if is_sharded_checkpoint(path):
            if self.lora:
                raise RunDirError(
                    f"{path}: a sharded full-weight checkpoint; this run is a LoRA run (model.lora)"
                )
            meta = load_sharded(self.transformer, self.optimizer, path, checkpoint_group())
            self.version, self.iteration = meta["version"], meta["iteration"]
        elif self.sharded:
            state = None
            if self.share.rank == 0:
                state = torch.load(path, map_location="cpu", weights_only=False)
                self._check_kind(state)
            self.version, self.iteration = load_full_into_shards(
                self.transformer, self.optimizer, state, checkpoint_group()
            )
        else:
            self.load_state_dict(torch.load(path, map_location="cpu", weights_only=False))
        keep_kernel(self.optimizer, self.cfg.optim, self.cfg.model.device)
        return self.iteration

    def _check_kind(self, state: dict) -> None:
        key = "lora" if self.lora else "transformer"
        if key not in state:
            kind = "a LoRA" if self.lora else "a full-weight"
            raise RunDirError(
                f"checkpoint holds {sorted(k for k in state if k in ('lora', 'transformer'))}; "
                f"this run is {kind} run (model.lora) and needs {key!r}"
            )

    def load_state_dict(self, state: dict) -> None:
        """A one-file checkpoint into one learner or a data-parallel replica."""
        self._check_kind(state)
        if self.lora:
            load_adapter_state(self.transformer, state["lora"])
        else:
            self.transformer.load_state_dict(state["transformer"])
        self.optimizer.load_state_dict(state["optimizer"])
        keep_kernel(self.optimizer, self.cfg.optim, self.cfg.model.device)
        self.version = state["version"]
        self.iteration = state["iteration"]
        self.objective.load(state)

    def export(self, directory: str) -> str | None:
        """Final weights in diffusers layouts: ``pytorch_lora_weights.safetensors``
        (``FluxPipeline.load_lora_weights``) or ``transformer/`` (``from_pretrained``).
        Every rank calls; rank 0 writes."""
        self.resident()
        from ..common.families.lora import save_lora_weights

        full = full_weights(self.transformer) if self.sharded else None
        if self.share.rank != 0:
            return None
        family = family_class(self.cfg)
        if self.lora:
            return str(save_lora_weights(self.transformer, directory, family.pipeline_class()))
        out = Path(directory) / "transformer"
        if full is None:
            self.transformer.save_pretrained(out)
        else:  # the gathered weights in a plain model, in the layout from_pretrained reads
            # built on the meta device and given the gathered tensors themselves: no
            # second copy of the weights, and no random initialisation to overwrite
            with torch.device("meta"):
                plain = family.transformer_class().from_config(self.transformer.config)
            plain.load_state_dict(full, assign=True)
            plain.save_pretrained(out)
        return str(out)
