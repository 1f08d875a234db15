"""SIGTERM (and SIGHUP) handled as Ctrl-C. `ray job stop`, Kubernetes and `kill` send
SIGTERM, a closed terminal SIGHUP; a run started in the background by a script cannot
even get SIGINT (a non-interactive shell starts background jobs with SIGINT ignored).
Under ``sigterm_as_interrupt`` each stops a command the same orderly way as Ctrl-C: a
run checkpoints its last iteration and says how to resume."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived; caught wherever Ctrl-C's KeyboardInterrupt is."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_received: int | None = None  # the last stopping signal since the newest block opened


def _raise_terminated(signum, frame) -> None:
    global _received
    _received = signum
    raise Terminated(signum)


STOPPING = (signal.SIGTERM, signal.SIGHUP)


_active = 0  # how many sigterm_as_interrupt blocks are open


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block (main thread only) SIGTERM and SIGHUP raise ``Terminated``."""
    global _active, _received
    _received = None
    previous = {s: signal.signal(s, _raise_terminated) for s in STOPPING}
    _active += 1
    try:
        yield
    finally:
        _active -= 1
        for s, handler in previous.items():
            signal.signal(s, handler)


def after_ray_init() -> None:
    """``ray.init`` sets the driver's SIGTERM handler to ``sys.exit(15)``, which stops a
    run without its checkpoint: inside a ``sigterm_as_interrupt`` block, ours again."""
    if _active and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)


def interrupted_exit_code(exc: KeyboardInterrupt) -> int:
    """The shell's convention: 128 + the signal's number (SIGTERM 143, SIGINT 130). Ray
    turns a signal that lands inside ``ray.get`` into a plain ``KeyboardInterrupt``
    (its interrupted status is re-raised as one), so the signal is also read from what
    the handler recorded."""
    if isinstance(exc, Terminated):
        return 128 + exc.signum
    return 128 + (_received if _received is not None else signal.SIGINT)
