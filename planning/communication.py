"""FSDP2's traffic between the learner ranks, per iteration, and the link it crosses.

A sharded learner group (a full fine-tune over several ranks, learner/distributed.py)
runs, for every forward(+backward) pass of a micro-batch (``Workload.learner_passes``):

- an all-gather of every block's parameters in the forward, in the compute dtype
  (``model.mixed_precision: fsdp`` gathers bfloat16; float32 otherwise), and again in the
  backward (FSDP2 reshards a block after its forward; a checkpointed block recomputes
  inside that backward gather, so checkpointing adds none);
- a reduce-scatter of the gradients in float32 after every backward (the group reduces
  each micro-batch's, it does not hold them unsynchronised);
- an all-gather more in the forward of a model without a backward (a KL reference or an
  old copy, ``Workload.learner_no_grad``).

A ring collective moves (n-1)/n of the gathered (or reduced) size through each rank, so
a rank's bytes are (n-1)/n x size, and its seconds those bytes over the link's bus
bandwidth. A LoRA group (data parallel) all-reduces its adapters' float32 gradients once
per optimizer step: 2 (n-1)/n x size. Publishing from a sharded group gathers the
rollout dtype's weights once (learner/checkpoints.py ``gather_full_state``).

The link: the learner group within one node talks over NVLink; a group that spans nodes
(more ranks' GPUs than a node holds) runs its rings across the link between the nodes
(``g2rpo plan --network nvlink|ib|tcp``), whose bandwidth then bounds every ring. The
rates are the calibration table's ``nvlink_gbps``, ``ib_gbps`` and ``tcp_gbps``.

Overlap: FSDP2 gathers the next block while the current one computes and reduce-scatters
a block's gradients while the next block's backward runs, so the traffic hides behind
the learner's compute up to the compute's length, except each pass's first gather and
last reduce-scatter (one block's: the pipeline's fill and drain)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..common.config.run import G2RPOConfig
from .workload import Workload, dtype_bytes

LINKS = ("nvlink", "ib", "tcp")
RATE = {"nvlink": "nvlink_gbps", "ib": "ib_gbps", "tcp": "tcp_gbps"}


@dataclass(frozen=True)
class Traffic:
    """One learner rank's collective bytes of an iteration."""

    link: str  # nvlink, ib or tcp: the slowest link the group's rings cross
    ranks: int
    per_pass: int  # bytes of one forward+backward pass (sharded), else 0
    learn: int  # bytes of the iteration's update (every pass; a LoRA group's all-reduces)
    unhidden: int  # of them, bytes no compute overlaps (each pass's fill and drain)
    publish: int  # bytes of gathering one published version (sharded), else 0


def ring(ranks: int) -> float:
    """The share of a collective's size each rank sends in a ring: (n-1)/n."""
    return (ranks - 1) / ranks


def learner_link(cfg: G2RPOConfig, network: str, gpus_per_node: int) -> str:
    """The link the learner group's rings cross: NVLink when its ranks' GPUs fit one
    node of ``gpus_per_node``, else ``network`` (the link between nodes)."""
    if network not in LINKS:
        raise ValueError(f"network {network!r}: one of {', '.join(LINKS)}")
    t = cfg.train
    gpus = t.learner.count * max(t.bundle_gpus(), 1.0)
    return "nvlink" if gpus <= gpus_per_node else network


def learner_traffic(
    cfg: G2RPOConfig,
    work: Workload,
    counts: dict,
    sharded: bool,
    network: str = "ib",
    gpus_per_node: int = 8,
) -> Traffic | None:
    """One rank's traffic of an iteration of ``cfg`` (``counts``: the transformer's
    parameter counts, planning/components.py ``parameter_counts``), or None for one
    learner."""
    t, m = cfg.train, cfg.model
    n = t.learner.count
    if n < 2:
        return None
    link = learner_link(cfg, network, gpus_per_node)
    if not sharded:  # data-parallel LoRA replicas: one all-reduce per optimizer step
        size = int(work.optimizer_steps * 2 * ring(n) * 4 * counts["adapters"])
        return Traffic(link, n, 0, size, size, 0)  # after the backward: nothing overlaps it
    gather = dtype_bytes(m.dtype) if m.mixed_precision == "fsdp" else 4
    params, block = counts["total"], counts["largest_block"]
    trained = work.learner_forwards - work.learner_no_grad
    extra = work.learner_no_grad / trained if trained else 0.0  # no-grad gathers a pass
    per_pass = ring(n) * params * ((2 + extra) * gather + 4)
    fill = ring(n) * block * (gather + 4)
    rollout = dtype_bytes(m.rollout_weights_dtype or m.dtype)
    return Traffic(
        link=link,
        ranks=n,
        per_pass=int(per_pass),
        learn=int(work.learner_passes * per_pass),
        unhidden=int(work.learner_passes * fill),
        publish=int(ring(n) * params * rollout),
    )


def exposed_seconds(traffic: Traffic, gbps: float, compute_s: float) -> float:
    """The seconds the traffic adds to a learn phase of ``compute_s`` of compute: what
    overlaps (all but the fill and drain) hides behind the compute up to its length."""
    total = traffic.learn / (gbps * 1e9)
    unhidden = traffic.unhidden / (gbps * 1e9)
    hidden = min(total - unhidden, compute_s)
    return max(total - hidden, 0.0) if math.isfinite(total) else total
