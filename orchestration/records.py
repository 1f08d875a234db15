"""What an iteration records: its metrics.jsonl row (rewards per reward model and
granularity, the learner's stats, NFE counts) and the progress-bar fields (an
evaluation's entries: run_directory/eval_rows.py)."""

from __future__ import annotations

import torch

from ..common.config.run import G2RPOConfig


def summarise_batches(batches, stats: dict) -> dict:
    """Rewards per reward model (and granularity), the learner's stats, NFE counts."""
    out: dict = {}
    for name in batches[0].leaf_rewards:
        train_vals, anchor_vals, per_g = [], [], {}
        for b in batches:
            r = b.leaf_rewards[name]
            kind = b.plan.scored_kind
            grid = b.plan.gather(r, kind)
            train_vals.append(grid.flatten())
            anchor_vals.append(b.plan.gather(r, "anchor").flatten())
            if kind == "branch":
                for gi, g in enumerate(b.plan.granularities):
                    per_g.setdefault(str(g), []).append(grid[:, :, gi].flatten())
        out[f"reward/{name}"] = float(torch.cat(train_vals).mean())
        out[f"anchor_reward/{name}"] = float(torch.cat(anchor_vals).mean())
        for g, vals in per_g.items():
            out[f"reward/{name}/g{g}"] = float(torch.cat(vals).mean())
    out.update(stats)
    out["nfe"] = sum(b.nfe for b in batches)
    out["model_calls"] = sum(b.model_calls for b in batches)
    out["nfe_rollout"] = sum(b.nfe_algorithm for b in batches)
    out["nfe_train"] = out["nfe_rollout"] + stats["nfe_learn"]
    out["weight_versions"] = sorted({b.version for b in batches})
    if any(b.plan.sde_steps for b in batches):  # which steps branched (a drawn subset varies)
        out["branch_steps"] = sorted({k for b in batches for k in b.plan.sde_steps})
    return out


def progress_fields(row: dict, cfg: G2RPOConfig) -> dict:
    main = cfg.rewards[0].name
    fields = {
        "reward": f"{row[f'reward/{main}']:.3f}",
        "loss": f"{row['loss']:.2e}",
        "it_s": f"{row['time/iteration_s']:.1f}",
    }
    if cfg.run.nfe_budget:  # the bar counts NFEs then (TrainingLoop.run): say the iteration
        fields["iteration"] = row["iteration"] + 1
    return fields


def iteration_row(step, publisher_counters: dict, learner_restarts: int) -> dict:
    """An iteration's metrics row, but for the NFE total the driver's budget adds.
    ``time/<phase>_s`` is the driver's wall time in each phase (``publish`` with
    overlapped iterations includes waiting for the rollout in flight);
    ``time/weight_push_s`` is the push's own work in either mode (rank 0 producing the
    version + the slowest worker loading it); colocated (train.placement), the slowest
    worker's and rank 0's moves of the iteration between device and host
    (``time/worker_onload_s`` ..., ``time/learner_offload_s`` ...). ``trajectory_bytes`` and
    ``reward_request_bytes`` are the largest a worker sent (to the learner ranks, in
    one scoring request)."""
    weights, summaries = step.weights, step.summaries
    row = {"iteration": step.iteration, "version": weights.version}
    row["weights_bytes"] = weights.nbytes
    row["weights_via"] = weights.via
    row.update(publisher_counters)
    if learner_restarts:
        row["learner_restarts"] = learner_restarts
    row.update(summarise_batches(summaries, step.stats))
    row["nfe_train_total"] = None  # the driver's budget fills it in
    row.update(step.evaluation)
    row.update(step.clock.row())
    row.setdefault("time/eval_s", 0.0)
    row["time/weight_push_s"] = weights.push_s
    row["time/rollout_s"] = max(b.timings["rollout_s"] for b in summaries)
    row["time/reward_s"] = max(b.timings["reward_s"] for b in summaries)
    if all("offload_s" in b.timings for b in summaries):  # colocated: the workers' moves
        row["time/worker_onload_s"] = max(b.timings["onload_s"] for b in summaries)
        row["time/worker_offload_s"] = max(b.timings["offload_s"] for b in summaries)
    row["trajectory_bytes"] = max(b.nbytes for b in summaries)
    sent = [b.timings.get("reward_request_bytes") for b in summaries]
    if all(n is not None for n in sent):
        row["reward_request_bytes"] = max(sent)
        row["reward_requests"] = sum(b.timings.get("reward_requests", 1) for b in summaries)
    return row
