"""Two compare processes never train one run: the claim is an OS file lock (filelock),
held while its process lives and dropped by the OS when it dies, however it dies."""

import subprocess
import sys

from g2rpo.evaluation.run_claims import claim, held_elsewhere, release


def _claim_in_child(run_dir) -> bool:
    code = (
        "import sys; from pathlib import Path;"
        "from g2rpo.evaluation.run_claims import claim;"
        f"sys.exit(0 if claim(Path({str(run_dir)!r})) else 3)"
    )
    return subprocess.run([sys.executable, "-c", code]).returncode == 0


def _holder(run_dir) -> subprocess.Popen:
    """A process that claims the run, says so, and then hangs until it is killed."""
    code = (
        "import sys, time; from pathlib import Path;"
        "from g2rpo.evaluation.run_claims import claim;"
        f"ok = claim(Path({str(run_dir)!r})); print('held' if ok else 'refused', flush=True);"
        "time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_live_holder_keeps_the_run(tmp_path):
    run = tmp_path / "run-s0"
    assert not held_elsewhere(run)  # nobody has asked yet
    assert claim(run)
    assert claim(run)  # its own claim again
    assert not held_elsewhere(run)  # held, but here
    assert not _claim_in_child(run)  # another process is refused
    release(run)
    assert _claim_in_child(run)  # released: another process takes it (and exits)
    assert claim(run)
    release(run)
    release(run)  # releasing a run not held is harmless


def test_another_live_process_holds_it_until_it_is_killed(tmp_path):
    run = tmp_path / "run-s1"
    holder = _holder(run)
    try:
        assert held_elsewhere(run)
        assert not claim(run)
        holder.kill()  # a crash: no release, no clean-up
        holder.wait(timeout=30)
        assert not held_elsewhere(run)  # the OS dropped the dead holder's lock
        assert claim(run)
        assert not _claim_in_child(run)
    finally:
        holder.kill()
        holder.wait(timeout=30)
        release(run)
