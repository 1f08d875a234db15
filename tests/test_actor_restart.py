"""Redoing a call on an actor Ray is restarting (orchestration/cluster.py)."""

import os
import signal
import time

import pytest
import ray
from g2rpo.orchestration.cluster import call_with_restart

pytestmark = pytest.mark.slow  # a Ray actor


@ray.remote(max_restarts=-1, max_task_retries=0)
class SlowToRestart:
    """Its restarts take ``restart_s``, as a rollout worker's new process importing
    torch on a busy node does."""

    def __init__(self, marker: str, restart_s: float) -> None:
        if os.path.exists(marker):
            time.sleep(restart_s)
        else:
            open(marker, "w").close()

    def ready(self) -> bool:
        return True

    def pid(self) -> int:
        return os.getpid()

    def answer(self) -> int:
        return 42


def test_a_call_waits_for_a_slow_restart_instead_of_giving_up(ray_local, tmp_path):
    """Killed, then redone at once: Ray answers ActorUnavailableError while the new
    process starts; the redo waits for it (three tries a second apart gave up and
    ended the run: found by a clean-clone CI run on a loaded machine). The call's own
    timeout (2 s) does not count the restart."""
    actor = SlowToRestart.remote(str(tmp_path / "started"), 8.0)
    pid = ray.get(actor.pid.remote())
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    assert call_with_restart(lambda a: a.answer.remote(), actor, timeout=2) == 42
    assert time.monotonic() - t0 >= 7.0  # it did wait for the restart
    assert ray.get(actor.pid.remote()) != pid
    ray.kill(actor, no_restart=True)


def test_an_actor_that_keeps_dying_is_given_up_after_restart_s(ray_local, tmp_path):
    actor = SlowToRestart.remote(str(tmp_path / "started"), 0.0)

    def kill_then_call(a):
        os.kill(ray.get(a.pid.remote()), signal.SIGKILL)
        return a.answer.remote()

    t0 = time.monotonic()
    with pytest.raises(ray.exceptions.RayActorError):
        call_with_restart(kill_then_call, actor, restart_s=4)
    assert time.monotonic() - t0 < 30
    ray.kill(actor, no_restart=True)
