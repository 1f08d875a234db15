"""The run's budget in training NFEs (``run.nfe_budget``): stop before the iteration
that would pass it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Budget:
    """The run's training NFEs so far and whether another iteration still fits."""

    limit: int | None
    total: int = 0
    last: int = 0

    def add(self, nfe: int) -> None:
        self.total += nfe
        self.last = nfe

    def exhausted(self) -> bool:
        return self.limit is not None and self.last > 0 and self.total + self.last > self.limit

    def next_is_last(self) -> bool:
        """The coming iteration will exhaust it (estimated from the last one)."""
        return self.limit is not None and self.last > 0 and self.total + 2 * self.last > self.limit
