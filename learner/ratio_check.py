"""The probability ratio before any update: exactly 1 when the learner recomputes the
log-probs the rollout recorded (the precision check of `g2rpo doctor` and
`g2rpo bench precision`)."""

from __future__ import annotations

import torch


def ratio_before_update(learner, transitions, cond) -> torch.Tensor:
    """exp(log π_learner − log π_rollout) of every recorded SDE step, before any
    update (float64, CPU): 1 up to what the two sides compute differently. As in
    training, the conditioning moves to the learner's device and the states follow in
    the forwards the update runs: per optimizer step (``optim.step_mode``), each step's
    states stacked in forwards of at most ``train.learner.max_batch`` (``replay.py``),
    so a model whose output depends on its batch shows here what training sees."""
    from .distributed import SINGLE
    from .grpo import policy_log_ratio, recompute_log_probs
    from .replay import optimizer_groups, replay_chunks

    cfg = learner.cfg
    device = torch.device(cfg.model.device)
    tr = transitions.to("cpu")
    cond = {k: v.to(device) for k, v in cond.items()}
    ratios = torch.empty(len(tr), dtype=torch.float64)
    groups = optimizer_groups(tr, cfg.optim.step_mode, cfg.optim.samples_per_step)
    with torch.no_grad():
        for group in groups:
            for chunk in replay_chunks(tr, group, SINGLE, cfg.train.learner.max_batch):
                lp, mean, _ = recompute_log_probs(learner.velocity, tr, chunk, cond, learner.spec)
                # the ratio training clips: PPO's, flow_grpo's CPS one or GRPO-Guard's r̂
                log_ratio, _ = policy_log_ratio(learner.spec, tr, chunk, lp, mean)
                ratios[chunk] = torch.exp(log_ratio.double().cpu())
    return ratios
