"""Where a Ray actor runs: the options that ask Ray for its resources, and (called
inside the actor) the node, process and resources Ray gave it."""

from __future__ import annotations

import os

import ray


def where_am_i() -> dict:
    """Called inside an actor: its node, process, the resources Ray gave it, the
    torch CPU threads it computes with (a run's numbers depend on them) and its
    process's peak resident memory so far."""
    import resource

    import torch

    ctx = ray.get_runtime_context()
    return {
        "node_id": ctx.get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "pid": os.getpid(),
        "resources": {k: v for k, v in ctx.get_assigned_resources().items() if v},
        # which GPUs (Ray's ids; declared ones too): a colocated pair shares one
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "torch_threads": torch.get_num_threads(),
        # ru_maxrss is in KiB on Linux
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
