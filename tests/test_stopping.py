"""SIGTERM stops like Ctrl-C (common/stopping.py): `g2rpo compare` in the background
(SIGINT ignored, as a script's `&` leaves it) is sent SIGTERM while its run trains in a
process of its own; compare passes it on once, the run checkpoints its last iteration
and says how to resume, and both exit 143. (A lone `g2rpo train` stopped by SIGTERM:
tests/test_monitoring.py.)"""

import re
import signal
import subprocess
import time

import psutil
import pytest
from servers import G2RPO, session_ray_env
from small_run import assert_stopped_with_checkpoint
from test_compare import _spec_file

pytestmark = pytest.mark.slow


def test_sigterm_to_a_background_compare_checkpoints_its_run_and_exits_143(
    ray_local, world, tmp_path
):
    path = _spec_file(tmp_path, world)
    # one method, a budget it will not reach before the signal
    text = re.sub(r"  dancegrpo:\n(    .*\n)+", "", path.read_text())
    path.write_text(
        text.replace("budget: {iterations: 2, also_at_iterations: 1}", "budget: {iterations: 50}")
    )
    run_dir = tmp_path / "out" / "two" / "runs" / "g2rpo-s0"
    env = session_ray_env()  # compare's run joins the session's Ray, as a job's would
    cmd = [G2RPO, "compare", str(path), "--no-progress"]
    # SIGINT ignored, as in a non-interactive shell's background job
    compare = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    run = None
    try:
        deadline = time.monotonic() + 300
        metrics = run_dir / "metrics.jsonl"
        while not (metrics.is_file() and metrics.read_text().strip()):
            assert compare.poll() is None, compare.stdout.read()
            assert time.monotonic() < deadline, "no iteration within 300 s"
            time.sleep(0.2)
        (run,) = psutil.Process(compare.pid).children()  # the run's `g2rpo train`
        compare.send_signal(signal.SIGTERM)
        out, _ = compare.communicate(timeout=180)
    finally:
        if compare.poll() is None:
            compare.kill()
            if run is not None and run.is_running():  # its own session: not reached by that
                run.kill()
    assert compare.returncode == 143, out
    assert "interrupted; run the same command again to resume" in out, out
    assert psutil.wait_procs([run], timeout=30)[1] == []  # the run ended with it
    assert_stopped_with_checkpoint((run_dir / "train.log").read_text(), run_dir)
    assert not (run_dir / "finished.json").exists()


_SIGTERM_INSIDE_RAY_GET = """
import os, signal, sys, threading, time
import ray
from g2rpo.common.ray_init import init_ray
from g2rpo.common.stopping import interrupted_exit_code, sigterm_as_interrupt

@ray.remote(num_cpus=0)
def wait_long():
    time.sleep(60)

try:
    with sigterm_as_interrupt():
        init_ray()
        ref = wait_long.remote()
        threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
        ray.get(ref)
except KeyboardInterrupt as exc:
    print(type(exc).__name__)
    sys.exit(interrupted_exit_code(exc))
"""


def test_sigterm_landing_inside_ray_get_still_exits_143(ray_local):
    """Ray re-raises a signal caught while it waits in ``ray.get`` as a plain
    KeyboardInterrupt, dropping ours; the exit code must still say SIGTERM (CI saw a
    SIGTERM-stopped `g2rpo train` exit 130 when the signal landed there)."""
    import sys

    child = subprocess.run(
        [sys.executable, "-c", _SIGTERM_INSIDE_RAY_GET],
        env=session_ray_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.stdout.strip() == "KeyboardInterrupt", child.stdout + child.stderr[-2000:]
    assert child.returncode == 143, child.stderr[-2000:]
