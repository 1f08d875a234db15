"""The probability ratio before any update: exactly 1 when the learner recomputes the
log-probs the rollout recorded (the precision check of `g2rpo doctor` and
`g2rpo bench precision`)."""

from __future__ import annotations

import torch


def ratio_before_update(learner, transitions, cond) -> torch.Tensor:
    """exp(log π_learner − log π_rollout) of every recorded SDE step, before any
    update (float64, CPU): 1 up to what the two sides compute differently. As in
    training, the conditioning moves to the learner's device and the states follow
    in chunks of ``train.learner.max_batch`` distinct states."""
    from .distributed import SINGLE
    from .grpo import policy_log_ratio, recompute_log_probs

    device = torch.device(learner.cfg.model.device)
    tr = transitions.to("cpu")
    cond = {k: v.to(device) for k, v in cond.items()}
    rows = torch.arange(len(tr))
    ratios = torch.empty(len(tr), dtype=torch.float64)
    with torch.no_grad():
        for chunk in SINGLE.chunks(rows, tr.state_index, learner.cfg.train.learner.max_batch):
            lp, mean, _ = recompute_log_probs(learner.velocity, tr, chunk, cond, learner.spec)
            # the ratio training clips: PPO's, flow_grpo's CPS one or GRPO-Guard's r̂
            log_ratio, _ = policy_log_ratio(learner.spec, tr, chunk, lp, mean)
            ratios[chunk] = torch.exp(log_ratio.double().cpu())
    return ratios
