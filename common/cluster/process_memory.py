"""A process's host memory as the kernel counts it (``/proc/PID/status``), read now or
sampled for its peak while something runs. Linux only; no Ray, so the GPU checks and the
doctor read it where Ray is not installed.

* ``RssAnon``: private (anonymous) pages; a private copy of a weight version shows here.
* ``RssShmem``: shared-memory pages mapped and touched (Ray's object store is a file on
  /dev/shm: its pages count here, once per node however many processes map them);
  ``RssFile``: the same for file-backed pages (a store on disk).
* ``VmRSS`` is their sum; ``VmHWM`` its peak since the start (or a ``clear_refs`` reset).
"""

from __future__ import annotations

import threading
import time

FIELDS = ("RssAnon", "RssShmem", "RssFile", "VmRSS", "VmHWM")


def read_status(pid: int | str = "self") -> dict[str, int]:
    """FIELDS of /proc/PID/status, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in FIELDS:
                out[key] = int(value.split()[0]) * 1024
    return out


class PeakSampler:
    """Each pid's status every ``period_s`` on a thread while in the ``with`` block,
    keeping the peak of each field (``peaks[pid]``)."""

    def __init__(self, pids: list[int | str], period_s: float = 0.001) -> None:
        self.peaks = {p: read_status(p) for p in pids}
        self.period_s, self._stop = period_s, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid, peak in self.peaks.items():
                try:
                    now = read_status(pid)
                except OSError:  # the process ended
                    continue
                for k, v in now.items():
                    peak[k] = max(peak.get(k, 0), v)
            time.sleep(self.period_s)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
