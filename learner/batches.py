"""Workers' trajectory batches as one: what every objective family reads."""

from __future__ import annotations

import torch

from ..common.trajectories import Trajectories, Transitions, adv_slot_offsets


def merge(batches: list[Trajectories]) -> tuple[Transitions, dict[str, torch.Tensor]]:
    """Concatenate workers' transitions, re-indexing states, prompts and advantage slots."""
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
        return None if any(t is None for t in tensors) else torch.cat(tensors)

    merged = Transitions(**{f: cat(f) for f in Transitions.__dataclass_fields__})
    cond = {k: torch.cat([c[k] for c in conds]) for k in conds[0]}
    return merged, cond
