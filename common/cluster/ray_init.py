"""Ray for a command that needs it: the cluster RAY_ADDRESS names (as a job joins it),
else a local one of the caller's settings."""

from __future__ import annotations

import logging
import os
import signal

from .stopping import STOPPING, after_ray_init


def init_ray(actor_logs: bool = False, **local) -> None:
    """``ray.init`` at RAY_ADDRESS (Ray's INFO lines are not the command's output; with
    ``actor_logs`` the actors' output is, which on a cluster is the only way it reaches
    ``ray job logs``), else ``ray.init(**local)``; then SIGTERM is the command's again
    (common/cluster/stopping.py)."""
    import ray

    if os.environ.get("RAY_ADDRESS"):
        ray.init(address="auto", log_to_driver=actor_logs, logging_level=logging.WARNING)
    else:
        # The local Ray's processes are this one's children, in its process group: a
        # SIGTERM to the whole group (`timeout`, a batch scheduler's cancel, a service
        # manager) killed the GCS under the run's orderly stop, which then waited 60 s
        # for it and exited 1. Started with SIGTERM and SIGHUP blocked (a child inherits
        # the signal mask, as Ray's own start blocks SIGINT), they leave the stop to this
        # process, which ends them at ray.shutdown (SIGKILL) or by dying (Ray's fate
        # sharing: they are killed with their parent).
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)
        try:
            ray.init(**local)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    after_ray_init()
