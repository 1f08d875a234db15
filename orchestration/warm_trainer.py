"""``g2rpo compare --in-process``: compare's runs trained one after another in the
compare process, on one pool of actors kept warm between them (warm_actors.py), where
each run would otherwise be a ``g2rpo train`` process starting its actors cold."""

from __future__ import annotations

from pathlib import Path

from .driver import train
from .warm_actors import WarmActors


class WarmTrainer:
    """compare's ``train_one``: trains a run from its config file, or resumes its
    directory, on the pool (one made here, and closed by :meth:`close`, unless the
    caller gives its own)."""

    def __init__(self, warm: WarmActors | None = None) -> None:
        self.own = warm is None
        self.warm = WarmActors() if warm is None else warm

    def __call__(self, config: Path, resume: Path | None) -> None:
        train(None if resume else config, [], resume=resume, progress=False, warm=self.warm)

    def close(self) -> None:
        if self.own:
            self.warm.close()
