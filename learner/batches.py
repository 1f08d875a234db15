"""Workers' trajectory batches as one: what every objective family reads."""

from __future__ import annotations

import torch

from ..common.wire.trajectories import Trajectories, Transitions, adv_slot_offsets

# the sample tensors: gigabytes in a real iteration, kept where they arrived
_STACKED = ("states", "next_samples", "old_means")


class RowStack:
    """Tensors laid end to end along their first dimension without copying them:
    indexing with row numbers gathers just those rows. A learner rank recomputes a
    few states at a time, so concatenating every worker's batch would only make a
    private copy of the whole iteration (the batches themselves are views of Ray's
    shared object store: ``common/wire/shared_tensors.py``)."""

    def __init__(self, parts: list[torch.Tensor]) -> None:
        tail = {tuple(p.shape[1:]) for p in parts}
        if len(tail) != 1 or len({p.dtype for p in parts}) != 1:
            raise ValueError(
                f"batches disagree on a sample tensor's layout: shapes "
                f"{[tuple(p.shape) for p in parts]}, dtypes {sorted({str(p.dtype) for p in parts})}"
            )
        self.parts = parts
        self.starts = torch.tensor([0, *torch.cumsum(torch.tensor([len(p) for p in parts]), 0)])
        self.shape = torch.Size([int(self.starts[-1]), *parts[0].shape[1:]])
        self.dtype = parts[0].dtype

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: torch.Tensor) -> torch.Tensor:
        if not isinstance(rows, torch.Tensor) or rows.dim() != 1 or rows.is_floating_point():
            raise TypeError("a RowStack is indexed by a 1-D tensor of row numbers or a mask")
        if rows.dtype == torch.bool:
            rows = rows.nonzero().flatten()
        rows = rows.cpu()
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= len(self)):
            raise IndexError(f"rows outside 0..{len(self) - 1}")
        part = torch.searchsorted(self.starts[1:], rows, right=True)
        out = torch.empty((rows.numel(), *self.shape[1:]), dtype=self.dtype)
        for p in torch.unique(part).tolist():
            mine = part == p
            out[mine] = self.parts[p][rows[mine] - self.starts[p]]
        return out


def merge(batches: list[Trajectories]) -> tuple[Transitions, dict[str, torch.Tensor]]:
    """Workers' transitions as one, re-indexing states, prompts and advantage slots; the
    sample tensors are stacked (``RowStack``), the rest concatenated."""
    parts, conds = [], []
    s_off = p_off = 0
    for b, a_off in zip(batches, adv_slot_offsets(batches), strict=True):
        t = b.transitions
        parts.append(
            Transitions(
                states=t.states,
                state_step=t.state_step,
                state_prompt=t.state_prompt + p_off,
                next_samples=t.next_samples,
                next_step=t.next_step,
                old_log_probs=t.old_log_probs,
                state_index=t.state_index + s_off,
                adv_slot=t.adv_slot + a_off,
                old_means=t.old_means,
                noise_scale=t.noise_scale,
            )
        )
        conds.append(b.cond)
        s_off += t.states.shape[0]
        p_off += b.plan.num_prompts

    def cat(name):
        tensors = [getattr(p, name) for p in parts]
        if name == "noise_scale" and any(t is not None for t in tensors):  # None: all 1
            tensors = [
                torch.ones(len(p), dtype=torch.float64) if t is None else t
                for p, t in zip(parts, tensors, strict=True)
            ]
        if any(t is None for t in tensors):
            return None
        if name in _STACKED:
            return tensors[0] if len(tensors) == 1 else RowStack(tensors)
        return torch.cat(tensors)

    merged = Transitions(**{f: cat(f) for f in Transitions.__dataclass_fields__})
    cond = {k: torch.cat([c[k] for c in conds]) for k in conds[0]}
    return merged, cond
