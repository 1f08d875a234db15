"""Two compare processes never train one run: the lock names a live process; a dead
holder's lock is taken over."""

import os
import subprocess
import sys

from g2rpo.evaluation.run_claims import LOCK, claim, held_elsewhere, release


def _claim_in_child(run_dir) -> bool:
    code = (
        "import sys; from pathlib import Path;"
        "from g2rpo.evaluation.run_claims import claim;"
        f"sys.exit(0 if claim(Path({str(run_dir)!r})) else 3)"
    )
    return subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_a_live_holder_keeps_the_run(tmp_path):
    run = tmp_path / "run-s0"
    assert claim(run)
    assert (run / LOCK).read_text().strip() == str(os.getpid())
    assert claim(run)  # its own claim again
    assert not _claim_in_child(run)  # another process is refused
    release(run)
    assert not (run / LOCK).exists()


def test_a_dead_holders_lock_is_taken_over(tmp_path):
    run = tmp_path / "run-s1"
    assert _claim_in_child(run)  # the child exits: its lock stays behind, stale
    holder = int((run / LOCK).read_text())
    assert holder != os.getpid()
    assert not held_elsewhere(run)
    assert claim(run)
    assert int((run / LOCK).read_text()) == os.getpid()
