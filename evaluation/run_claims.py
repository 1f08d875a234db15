"""Which compare process trains a run: ``<run>/compare.lock`` holds its pid, so two
compare processes on one comparison (more cores, or a second terminal) never train
the same run at once. A lock whose process has died is taken over."""

from __future__ import annotations

import os
from pathlib import Path

LOCK = "compare.lock"


def _holder(run_dir: Path) -> int | None:
    try:
        return int((run_dir / LOCK).read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def held_elsewhere(run_dir: Path) -> bool:
    """Another live process holds the run."""
    pid = _holder(run_dir)
    return pid is not None and pid != os.getpid() and _alive(pid)


def claim(run_dir: Path) -> bool:
    """Take the run for this process; False while another live process holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        if held_elsewhere(run_dir):
            return False
        path.write_text(f"{os.getpid()}\n")  # stale: its process is gone
        return True
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")
    return True


def release(run_dir: Path) -> None:
    if _holder(run_dir) == os.getpid():
        (run_dir / LOCK).unlink(missing_ok=True)
