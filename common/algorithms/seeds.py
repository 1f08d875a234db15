"""Seeds as pure functions of (run seed, iteration, worker, stream)."""

from __future__ import annotations

import numpy as np


def seed_for(seed: int, iteration: int, worker: int, stream: int = 0) -> int:
    """Seeds are pure functions of (run seed, iteration, worker): a redone rollout, a
    restarted actor and a resumed run all draw the same noise."""
    return int(np.random.SeedSequence([seed, iteration, worker, stream]).generate_state(1)[0])
