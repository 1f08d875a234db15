"""Splitting an iteration's prompts into the workers' shares, and collecting a rollout:
each worker's summary, and a reference to its trajectories, which go to the learner ranks
from the worker's node and never through the driver. A worker that died, or whose share is
not back within ``train.workers.rollout_timeout_s`` (then it is killed), is restarted by
Ray, loads the weights the rollout was started with and redoes its share once; the late
result is never used, so no trajectory is trained twice or lost. So does a worker that Ray
restarted between the publish and its share, whose share comes back sampled with other
weights than the ones published."""

from __future__ import annotations

from dataclasses import dataclass

import ray

from ..common.errors import RunFailed
from .cluster import call_with_restart, get_or_redo
from .publishing import Published, check_loaded


@dataclass
class PendingRollout:
    iteration: int
    weights: Published
    shares: list
    summaries: list  # each worker's RolloutSummary ref
    trajectories: list  # each worker's Trajectories ref (a redo replaces it)


def collect_shares(pending: PendingRollout, actors, timeout, restart_s, newest: Published | None):
    """(summaries, trajectory refs) of every worker's share, in worker order.
    ``newest``: the version the workers must hold after (overlapped iterations), which a
    redone share's worker loads again."""
    results = []
    for i, ref in enumerate(pending.summaries):
        worker, redone = actors.workers[i], []

        def redo(actor, i=i, redone=redone):
            redone.append(True)
            ray.get(pending.weights.load_on(actor))
            rewards = actors.rewards.endpoints()
            summary, batch = actor.rollout.remote(pending.iteration, pending.shares[i], rewards)
            pending.trajectories[i] = batch
            return summary

        try:
            result = get_or_redo(ref, redo, worker, timeout, restart_s)
            if result.version != pending.weights.version:
                # restarted by Ray after the weights reached it and before this share:
                # the new actor rolled out with the weights it starts with. Redo it.
                result = call_with_restart(redo, worker, timeout=timeout, restart_s=restart_s)
            results.append(result)
        except ray.exceptions.GetTimeoutError:
            raise RunFailed(
                f"rollout worker {i} did not finish iteration {pending.iteration}'s share "
                f"within train.workers.rollout_timeout_s={timeout} s, twice"
            ) from None
        if redone and newest is not None and newest.version != pending.weights.version:
            # overlapped: the redo loaded the version it was sampled with; the next
            # rollout needs the newest again
            got = get_or_redo(newest.load_on(worker), newest.load_on, worker, timeout, restart_s)
            check_loaded(i, got, newest)
    return results, list(pending.trajectories)


def split_prompts(prompts: list[str], counts: list[int]) -> list[list[str]]:
    """The iteration's prompts in consecutive shares of ``counts`` (worker i's is the
    i-th; ``train.workers.prompt_counts``), every prompt in exactly one share."""
    if sum(counts) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts cannot be split into shares of {counts}")
    shares, start = [], 0
    for n in counts:
        shares.append(prompts[start : start + n])
        start += n
    return shares
