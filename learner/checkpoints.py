"""Learner checkpoints in two layouts, each readable by any number of learners:

* ``it_NNNNN.pt``, one file (``torch.save``): a single learner, or a data-parallel
  group's rank 0 (its replicas are identical) — the trained weights (the adapters of
  a LoRA run), the optimizer state, the weight version and iteration;
* ``it_NNNNN.dcp/``, a sharded directory (``torch.distributed.checkpoint``): an FSDP
  learner group, every rank writing its shards of the weights and of the optimizer
  state, keyed by parameter name, plus ``g2rpo.json`` (version, iteration); written
  as ``it_NNNNN.dcp.partial/`` and renamed once complete.

Loading reshards: a group of any size (or one learner) reads either layout."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from ..common.errors import RunDirError

SHARDED_SUFFIX = ".dcp"
PARTIAL = ".partial"
META = "g2rpo.json"


def is_sharded_checkpoint(path: str | Path) -> bool:
    return Path(path).is_dir()


def complete(path: Path) -> bool:
    """A file checkpoint, or a sharded one whose marker was written."""
    return path.is_file() or (path / META).is_file()


def _alone() -> bool:
    """No process group: one process reads a checkpoint a group wrote."""
    import torch.distributed as dist

    return not dist.is_initialized()


@contextmanager
def _quiet_single_process():
    """DCP warns on every single-process load that it assumes one is meant: it is."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")
        yield


def _options(full: bool = False, from_rank0: bool = False, strict: bool = True):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # frozen weights (a LoRA run's base) are the pipeline's, not the checkpoint's
    return StateDictOptions(
        ignore_frozen_params=True,
        full_state_dict=full,
        broadcast_from_rank0=from_rank0,
        strict=strict,
    )


def save_sharded(transformer, optimizer, directory: str | Path, meta: dict, group=None) -> None:
    """Every rank writes its shards into ``<directory>.partial``; rank 0 then writes
    the marker and moves it into place, so a checkpoint found under its own name is
    always whole (a crash leaves only a ``.partial`` that pruning removes). The ranks
    coordinate over ``group`` (``distributed.checkpoint_group()``: gloo, with a timeout
    that allows for the slowest rank's write; None: the default group)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    directory = Path(directory)
    partial = directory.with_name(directory.name + PARTIAL)
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    if rank0:
        shutil.rmtree(partial, ignore_errors=True)  # a stale partial: up to a whole checkpoint
    if dist.is_initialized():
        dist.barrier(group=group)
    model, optim = get_state_dict(transformer, optimizer, options=_options())
    dcp.save({"model": model, "optim": optim}, checkpoint_id=str(partial), process_group=group)
    if rank0:
        (partial / META).write_text(json.dumps(meta) + "\n")
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(partial, directory)


def load_sharded(transformer, optimizer, directory: str | Path, group=None) -> dict:
    """Load a sharded checkpoint into this rank's shards (or into a plain model and
    optimizer, without a process group), coordinating over ``group`` as
    ``save_sharded`` does; returns its marker (version, iteration)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    directory = Path(directory)
    if not (directory / META).is_file():
        raise RunDirError(f"{directory}: an incomplete sharded checkpoint (no {META})")
    meta = json.loads((directory / META).read_text())
    model, optim = get_state_dict(transformer, optimizer, options=_options())
    # AdamW makes a parameter's state at its first gradient: one that never had one (a
    # block output nothing reads) has none in the checkpoint, while get_state_dict gave
    # this fresh optimizer state for every parameter. Load what was saved, then drop
    # the rest, so the optimizer is the one that was saved.
    stored = dcp.FileSystemReader(str(directory)).read_metadata().state_dict_metadata
    never = [n for n in optim["state"] if not any(f"optim.state.{n}." in k for k in stored)]
    for name in never:
        del optim["state"][name]
    with _quiet_single_process():
        dcp.load(
            {"model": model, "optim": optim},
            checkpoint_id=str(directory),
            process_group=group,
            no_dist=_alone(),
        )
    # not strict: only for the optimizer states left out above (the model's keys were
    # every one of its own, and dcp.load found each in the checkpoint)
    set_state_dict(
        transformer,
        optimizer,
        model_state_dict=model,
        optim_state_dict=optim,
        options=_options(strict=not never),
    )
    params = dict(transformer.named_parameters())
    for name in never:
        optimizer.state.pop(params[name], None)
    return meta


def load_full_weights(transformer, weights: dict) -> None:
    """Rank 0's full weights into every rank's FSDP shards (the other ranks pass an
    empty dict: rank 0 broadcasts tensor by tensor, each rank keeps its shard)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(transformer, weights, options=_options(full=True, from_rank0=True))


def load_full_into_shards(
    transformer, optimizer, state: dict | None, group=None
) -> tuple[int, int]:
    """A one-file checkpoint, read by rank 0 only (``state``; None elsewhere), into
    the group's FSDP shards: weights and (index-keyed) optimizer state are broadcast
    from rank 0. Returns (version, iteration) on every rank. The other ranks wait for
    rank 0's read in the first broadcast, over ``group`` (as ``save_sharded``)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    meta = [None]
    if state is not None:
        meta = [(state["version"], state["iteration"])]
    dist.broadcast_object_list(meta, src=0, group=group)
    weights, by_name = {}, {}
    if state is not None:
        weights = state["transformer"]
        names = [n for n, p in transformer.named_parameters() if p.requires_grad]
        opt = state["optimizer"]
        by_name = {
            "state": {names[i]: s for i, s in opt["state"].items()},
            "param_groups": [
                {**g, "params": [names[i] for i in g["params"]]} for g in opt["param_groups"]
            ],
        }
    load_full_weights(transformer, weights)
    set_optimizer_state_dict(
        transformer, optimizer, by_name, options=_options(full=True, from_rank0=True)
    )
    return meta[0]


def load_weights_into(transformer: torch.nn.Module, directory: str | Path) -> None:
    """A sharded checkpoint's transformer weights into a plain transformer (evaluation)."""
    import torch.distributed.checkpoint as dcp

    state = dict(transformer.state_dict())
    with _quiet_single_process():
        dcp.load({"model": state}, checkpoint_id=str(directory), no_dist=_alone())
    transformer.load_state_dict(state)


def gathered_tensors(
    transformer: torch.nn.Module, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight of ``transformer``, whole and on its device, one at a time, on every
    rank of an FSDP group (every rank must iterate: each step is a collective);
    floating-point tensors in ``dtype`` when given, the others as they are. Each rank
    first casts its shard on its device: the gather moves the bytes asked for (bfloat16:
    half of float32). A cast rounds each element alone, so casting the shards and then
    gathering gives the bytes gathering and then casting gives."""
    from torch.distributed.tensor import DTensor

    for name, tensor in transformer.state_dict().items():
        tensor = tensor.detach()
        if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
            tensor = tensor.to(dtype)  # a DTensor casts its local shard
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()  # an all-gather: every rank takes part
        yield name, tensor


def full_weights(
    transformer: torch.nn.Module, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """Every weight, whole and on the CPU, on rank 0 of an FSDP group (every rank
    must call; the others get an empty dict): ``gathered_tensors``, of which rank 0's
    host never holds more than the result (no float32 copy to cast from)."""
    import torch.distributed as dist

    rank0 = dist.get_rank() == 0
    out = {}
    for name, tensor in gathered_tensors(transformer, dtype):
        if rank0:
            # a copy even where it is already on the CPU: the result never aliases
            # the weights training goes on changing (a one-rank group's gather is a view)
            out[name] = tensor.to("cpu", copy=True)
    return out
