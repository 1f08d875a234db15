"""Which compare process trains a run: it holds an OS lock on ``<run>/compare.lock``
(``filelock``: ``flock`` on Unix), so two compare processes on one comparison (more
cores, or a second terminal) never train the same run at once. The operating system
drops the lock when its process ends, however it ends, so a crashed holder never
blocks the run; the file itself stays behind and means nothing unlocked."""

from __future__ import annotations

from pathlib import Path

from filelock import FileLock, Timeout

LOCK = "compare.lock"

_held: dict[Path, FileLock] = {}  # the runs this process claimed, by resolved directory


def _key(run_dir: Path) -> Path:
    return Path(run_dir).resolve()


def _lock(run_dir: Path) -> FileLock:
    return FileLock(Path(run_dir) / LOCK, thread_local=False)


def claim(run_dir: Path) -> bool:
    """Take the run for this process; False while another live process holds it."""
    if _key(run_dir) in _held:
        return True
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    lock = _lock(run_dir)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return False
    _held[_key(run_dir)] = lock
    return True


def held_elsewhere(run_dir: Path) -> bool:
    """Another live process holds the run (asked by trying the lock, never waiting; a
    claim that meets this probe is refused once and is tried again later)."""
    if _key(run_dir) in _held or not (Path(run_dir) / LOCK).exists():
        return False
    probe = _lock(run_dir)
    try:
        probe.acquire(timeout=0)
    except Timeout:
        return True
    probe.release()
    return False


def release(run_dir: Path) -> None:
    """Let the run go (a run this process does not hold is left alone)."""
    lock = _held.pop(_key(run_dir), None)
    if lock is not None:
        lock.release()
