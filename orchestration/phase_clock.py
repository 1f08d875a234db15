"""One way to time an iteration: ``with clock.phase("learn"):`` around each phase of
the driver. Each phase's wall seconds go into the metrics row as ``time/<phase>_s``
(a phase entered twice adds up), and ``time/iteration_s`` is the iteration's wall
time less what ran ``aside`` (bookkeeping that is not part of the algorithm)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class PhaseClock:
    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.aside_s = 0.0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    @contextmanager
    def aside(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.aside_s += time.perf_counter() - t0

    def row(self) -> dict[str, float]:
        """``time/<phase>_s`` for every phase timed, and ``time/iteration_s``."""
        out = {f"time/{name}_s": s for name, s in self.seconds.items()}
        out["time/iteration_s"] = time.perf_counter() - self.started - self.aside_s
        return out
