"""Ray for a command that needs it: the cluster RAY_ADDRESS names (as a job joins it),
else a local one of the caller's settings."""

from __future__ import annotations

import logging
import os

from .stopping import after_ray_init


def init_ray(actor_logs: bool = False, **local) -> None:
    """``ray.init`` at RAY_ADDRESS (Ray's INFO lines are not the command's output; with
    ``actor_logs`` the actors' output is, which on a cluster is the only way it reaches
    ``ray job logs``), else ``ray.init(**local)``; then SIGTERM is the command's again
    (common/stopping.py)."""
    import ray

    if os.environ.get("RAY_ADDRESS"):
        ray.init(address="auto", log_to_driver=actor_logs, logging_level=logging.WARNING)
    else:
        ray.init(**local)
    after_ray_init()
