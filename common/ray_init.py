"""Ray for a command that needs it: the cluster RAY_ADDRESS names (as a job joins it),
else a local one of the caller's settings."""

from __future__ import annotations

import logging
import os

from .stopping import after_ray_init


def init_ray(**local) -> None:
    """``ray.init`` at RAY_ADDRESS (Ray's INFO lines are not the command's output), else
    ``ray.init(**local)``; then SIGTERM is the command's again (common/stopping.py)."""
    import ray

    if os.environ.get("RAY_ADDRESS"):
        ray.init(address="auto", log_to_driver=False, logging_level=logging.WARNING)
    else:
        ray.init(**local)
    after_ray_init()
