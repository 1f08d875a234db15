"""The log-prob PPO family's update (G²RPO, DanceGRPO, MixGRPO, Flow-GRPO, BranchGRPO,
TreeGRPO, TempFlow, GRPO-Guard): the workers' transitions merged, BranchGRPO's width
pruning, the clipped-surrogate update on each transition's recorded log-prob
(``grpo.grpo_update``), and how much each reward model moved the advantages."""

from __future__ import annotations

import torch

from ..common.algorithms.advantages import advantage_shares
from ..common.wire.trajectories import Trajectories
from .advantages import plan_reward_terms
from .batches import merge
from .grpo import grpo_update
from .objective import LearnerParts
from .replay import Replay
from .tree_pruning import chain_of_slot, width_pruned_rows


class PolicyGradient:
    """An objective with no state of its own: everything it needs is in the batches.
    ``replay``: how an optimizer step's states go through the model (``replay.py``);
    training stacks them, the per-step replay is the check's and the benchmark's."""

    def __init__(self, replay: Replay = "stacked") -> None:
        self.replay = replay

    def update(
        self, parts: LearnerParts, batches: list[Trajectories], advantages: torch.Tensor, lag: int
    ) -> dict:
        cfg, adv = parts.cfg, advantages
        transitions, cond = merge(batches)
        branch = cfg.algorithm.branchgrpo
        if (
            cfg.algorithm.name == "branchgrpo"
            and branch.width_pruning != "off"
            and cfg.branch_pruning_active(parts.iteration)
        ):
            chains = chain_of_slot(batches, max(branch.split_steps))
            chain = torch.tensor([chains.get(int(s), -1) for s in transitions.adv_slot])
            kept = width_pruned_rows(
                chain, adv[transitions.adv_slot], branch.width_pruning, branch.width_pruning_ratio
            )
            transitions = transitions.select(kept)
        # trajectories arrive on the CPU and stay there: each chunk's states move to the
        # device when recomputed (a whole iteration's would cost GiBs on every rank);
        # the conditioning is small and every chunk indexes it
        device = torch.device(cfg.model.device)
        cond = {k: v.to(device) for k, v in cond.items()}
        o = cfg.optim
        stats = grpo_update(
            parts.velocity,
            parts.trainable,
            parts.optimizer,
            transitions,
            adv,
            cond,
            parts.spec,
            clip_range=o.clip_range,
            max_grad_norm=o.max_grad_norm,
            step_mode=o.step_mode,
            samples_per_step=o.samples_per_step,
            reference_model=parts.reference,
            kl_beta=parts.kl_beta,
            share=parts.share,
            max_batch=cfg.train.learner.max_batch,
            replay=self.replay,
        ).as_dict()
        weights = cfg.reward_weights()
        terms = [
            plan_reward_terms(b.plan, {n: b.leaf_rewards[n] for n in weights}, cfg) for b in batches
        ]
        shares = advantage_shares({n: torch.cat([t[n].flatten() for t in terms]) for n in weights})
        stats.update({f"adv_share/{n}": share for n, share in shares.items()})
        stats["weight_lag"] = lag
        stats.update(
            {
                "adv_abs_mean": float(adv.abs().mean()),
                "adv_std": float(adv.std()),
                "adv_clipped_frac": float((adv.abs() >= o.adv_clip).double().mean()),
                # transitions that train nothing: every method's advantage is exactly 0
                # where a group's rewards are all equal (common with a 0/1 reward)
                "adv_zero_frac": float((adv == 0).double().mean()),
            }
        )
        return stats

    def state(self) -> dict:
        return {}

    def load(self, state: dict) -> None:
        pass

    def to(self, device: torch.device) -> None:
        pass
