"""The learner group's torch.distributed side, without Ray: joining the group,
sharding the transformer with FSDP2 (a full fine-tune) or keeping identical
replicas (data parallel, LoRA), each rank's share of an optimizer step's states,
summing gradients, and combining what the ranks measured.

Every rank sees the whole iteration (all workers' trajectories) and computes the
same advantages; it then recomputes the log-probs of its share of the distinct
states only. Gradients are *summed* over ranks: each rank weights its losses by
their share of the whole optimizer step, so the sum is the step's mean, exactly
as one learner computes it (up to the order of floating-point additions)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ..common.cluster.net import pin_to_ray_node
from ..common.wire.weight_sync import backend_for, use_device


@dataclass(frozen=True)
class RankShare:
    """Rank ``rank`` of ``world`` learners. ``sharded``: FSDP2 holds the weights,
    so every rank must run the same number of forward/backward passes per optimizer
    step (each forward gathers every block's parameters) and a rank with fewer
    states runs padding passes that add nothing to the gradient; otherwise the
    ranks are data-parallel replicas (or one learner)."""

    rank: int = 0
    world: int = 1
    sharded: bool = False

    def chunks(
        self, rows: torch.Tensor, state_index: torch.Tensor, max_states: int
    ) -> list[torch.Tensor | None]:
        """This rank's transition rows of one optimizer step, in chunks of at most
        ``max_states`` distinct states, never splitting one state's transitions. The
        step's distinct states are split into ``world`` contiguous, near-equal parts;
        ``None`` is a padding pass (sharded only)."""
        states = state_index[rows]
        unique = torch.unique(states)
        parts = torch.tensor_split(unique, self.world)
        mine = parts[self.rank]
        chunks: list[torch.Tensor | None] = [
            rows[torch.isin(states, mine[lo : lo + max_states])]
            for lo in range(0, mine.numel(), max_states)
        ]
        if self.sharded:
            most = max(math.ceil(p.numel() / max_states) for p in parts)
            chunks += [None] * (most - len(chunks))
        return chunks


SINGLE = RankShare()


# the gloo group the ranks coordinate checkpoints over (see join_learner_group)
_checkpoint_group: list = [None]


def join_learner_group(
    address: str,
    rank: int,
    world: int,
    device: str,
    timeout_s: float,
    checkpoint_timeout_s: float | None = None,
) -> None:
    """This process's default process group: the learner ranks (blocks until all
    ``world`` ranks joined). Then, on every rank in the same order, a gloo group over
    the same ranks for checkpoints (``checkpoint_group``), with a timeout of its own
    (``checkpoint_timeout_s``; None: ``timeout_s``): a rank that finished writing its
    shards waits there for the slowest writer on a shared filesystem, on the CPU,
    not in a device collective that the default group's watchdog aborts."""
    if dist.is_initialized():
        raise RuntimeError("this process already belongs to a learner group")
    pin_to_ray_node()  # gloo and NCCL on the interface other nodes reach (net.py)
    use_device(device)
    dist.init_process_group(
        backend_for(device),
        init_method=f"tcp://{address}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )
    waits = checkpoint_timeout_s if checkpoint_timeout_s is not None else timeout_s
    _checkpoint_group[0] = dist.new_group(backend="gloo", timeout=timedelta(seconds=waits))


def checkpoint_group():
    """The learner group's gloo group for checkpoints (``join_learner_group``); None
    outside a group."""
    return _checkpoint_group[0]


def leave_learner_group() -> None:
    """Out of the learner group: its default group and the checkpoint group."""
    _checkpoint_group[0] = None
    if dist.is_initialized():
        dist.destroy_process_group()  # every group of this process


def fsdp_modules(transformer: torch.nn.Module) -> list[torch.nn.Module]:
    """The units FSDP2 shards one by one: each FLUX transformer block (double and
    single stream), then the root holding the embedders and the output layers."""
    blocks = [
        *getattr(transformer, "transformer_blocks", []),
        *getattr(transformer, "single_transformer_blocks", []),
    ]
    return [*blocks, transformer]


def shard_transformer(
    transformer: torch.nn.Module, device: str, param_dtype: torch.dtype | None
) -> None:
    """FSDP2 (``fully_shard``) over the blocks and the root, in place. With
    ``param_dtype`` the parameters are gathered in that dtype for compute and the
    gradients reduced in float32 (the float32 master weights stay sharded);
    gradients are summed over ranks, not averaged (see the module's docstring)."""
    import warnings

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    # diffusers' blocks return views of their output; nothing downstream changes them
    # in place, which is what FSDP2 warns about (tests/test_learner_group.py checks
    # the group's gradients against one learner's)
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")

    policy = MixedPrecisionPolicy(
        param_dtype=param_dtype,
        reduce_dtype=torch.float32 if param_dtype is not None else None,
    )
    # on the learners' device, whatever accelerator the node has
    mesh = init_device_mesh(torch.device(device).type, (dist.get_world_size(),))
    for module in fsdp_modules(transformer):
        fully_shard(module, mesh=mesh, mp_policy=policy)
    for module in transformer.modules():
        if isinstance(module, FSDPModule):
            # plain sums (gloo has no pre-multiplied sum; a factor of 1 needs none)
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


def sum_gradients(parameters: list[torch.nn.Parameter]) -> None:
    """Data parallel: sum the replicas' gradients in one all-reduce of a flat
    buffer (one collective per optimizer step, however many backward passes each
    rank ran; DDP would all-reduce after every backward and needs equal counts)."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for p, g in zip(parameters, grads, strict=True):
        n = g.numel()
        p.grad = flat[offset : offset + n].view_as(g).clone()
        offset += n


def total_norm(norm: torch.Tensor) -> float:
    """``clip_grad_norm_``'s total norm as a float (a DTensor under FSDP2)."""
    full = getattr(norm, "full_tensor", None)
    return float(full() if full is not None else norm)


def gather_objects(obj) -> list:
    """Every rank's ``obj`` (small Python objects: statistics)."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
