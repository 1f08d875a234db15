"""Failures inside a training run on a real local Ray, with real processes killed
(docs/design.md, Failures): the Redis control plane stopped mid-run and started
again empty; a rollout worker SIGKILLed under broadcast weights with overlapped
iterations; a learner rank SIGKILLed, its group formed again from the last
checkpoint (run.max_failures), and the run stopped quietly once they are spent."""

import json
import os
import shutil
import signal
import subprocess
import threading
import time

import pytest
from g2rpo.orchestration.driver import read_metrics
from servers import G2RPO, RewardServerProcess, free_port, local_ray
from small_run import small_train, when_first_row


@pytest.fixture(scope="module")
def ray_local():
    # 2 workers, up to 2 learners, the job's reward replica, evaluator: 1 CPU each
    with local_ray(6, object_store_mb=256):
        yield


def _strip(rows, *also):
    """What a run computed: no timings, not how weights travelled, no failure counts."""
    drop = ("weights_via", "weight_groups_formed", "weight_broadcast_failures", *also)
    return [
        {k: v for k, v in r.items() if not k.startswith("time/") and k not in drop} for r in rows
    ]


def _when_rows(run_dir, n: int, act, timeout: float = 600):
    """A thread that runs ``act(actors.json record)`` once the run at ``run_dir``
    logged ``n`` iterations; ``act``'s dict is merged into the one returned."""
    done: dict = {}

    def watch():
        metrics, actors = run_dir / "metrics.jsonl", run_dir / "actors.json"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if metrics.exists() and actors.exists():
                rows = [ln for ln in metrics.read_text().splitlines() if ln.strip()]
                if len(rows) >= n:
                    done.update(act(json.loads(actors.read_text())))
                    return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, done


# ---------------------------------------------------------------- Redis away


class Redis:
    """redis-server as the deployments run it (no persistence) on a port of its
    own, stopped and started again on that same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = None
        self.start()

    def start(self) -> None:
        import redis

        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (.ci/run installs it)")
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(
            [exe, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        client = redis.Redis.from_url(self.url)
        for _ in range(250):
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not answer PING")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def test_redis_stopped_mid_run_and_started_again_empty_loses_nothing(
    ray_local, quick_world, tmp_path
):
    """Reward replicas are found in Redis and the run's status goes there. Redis is
    stopped after iteration 1 and started again, empty (no persistence), two
    iterations later: the workers keep scoring on the replica Redis listed last,
    `g2rpo status` reads the run directory meanwhile, the replica registers again,
    every iteration's row is in metrics.jsonl once, and the run's stream in Redis is
    whole again (rebuilt from metrics.jsonl), each iteration once."""
    import redis as redis_py
    from g2rpo.orchestration.telemetry import STREAM_KEY, read_status

    redis = Redis()
    server = RewardServerProcess(
        "--scorers", f"shapes_clip={quick_world / 'shapes_clip'}", "--redis-url", redis.url
    )
    run_dir = tmp_path / "outage"
    seen: dict = {}

    def outage(record):
        redis.stop()
        seen["stopped_after"] = len(read_metrics(run_dir))
        seen["status"] = read_status(str(run_dir), redis.url)  # from the run directory
        cli = subprocess.run(
            [G2RPO, "status", str(run_dir), "--redis-url", redis.url],
            capture_output=True,
            text=True,
            check=False,
        )
        seen["cli"] = (cli.returncode, cli.stdout, cli.stderr)
        deadline = time.monotonic() + 600
        while len(read_metrics(run_dir)) < seen["stopped_after"] + 2:  # trains on without it
            assert time.monotonic() < deadline
            time.sleep(0.1)
        seen["restarted_after"] = len(read_metrics(run_dir))
        redis.start()
        return {}

    thread, _ = _when_rows(run_dir, 2, outage)
    try:
        small_train(
            quick_world,
            tmp_path,
            "outage",
            6,
            ["train.reward.replicas=0", "train.checkpoint_every=100"],
            redis_url=redis.url,
        )
        thread.join(timeout=30)
        rows = read_metrics(run_dir)
        assert [r["iteration"] for r in rows] == [0, 1, 2, 3, 4, 5]
        assert all(r["transitions"] == 2 * 2 * 2 * 4 for r in rows)  # every prompt's share
        assert (run_dir / "finished.json").is_file()
        assert seen["stopped_after"] >= 2 and seen["restarted_after"] < 6, seen
        status = seen["status"]
        assert "redis_error" in status and status["run_dir"] == str(run_dir)
        assert status["iterations"] >= seen["stopped_after"]
        code, out, err = seen["cli"]
        assert code == 0 and "Redis did not answer" in err and "last iteration" in out, seen["cli"]

        client = redis_py.Redis.from_url(redis.url)
        stream = client.xrange(STREAM_KEY.format(name="outage"))
        assert [json.loads(f[b"row"])["iteration"] for _, f in stream] == [0, 1, 2, 3, 4, 5]
        live = read_status("outage", redis.url)
        assert live["state"] == "finished" and live["last"]["iteration"] == 5
        assert client.keys("g2rpo:replicas:*")  # the replica registered again
    finally:
        server.stop()
        redis.stop()


# ------------------------------------------- a rollout worker killed, overlapped

OVERLAP = ["train.staleness=1", "train.weight_transport=collective"]


@pytest.fixture(scope="module")
def calm_overlapped(ray_local, quick_world, tmp_path_factory):
    """The uninterrupted overlapped run with broadcast weights (1 learner)."""
    run = small_train(quick_world, tmp_path_factory.mktemp("calm-ov"), "calm-ov", 4, OVERLAP)
    return read_metrics(run)


def test_worker_killed_under_broadcast_weights_with_staleness_one(
    calm_overlapped, quick_world, tmp_path
):
    """train.staleness=1 with train.weight_transport=collective: a rollout worker
    SIGKILLed early in iteration 1 (while it rolls out on v0 beside the update) is
    restarted by Ray, loads the version its share was sampled with and redoes it,
    then the newest; the broadcast group is formed again with it. Every version and
    checksum check holds (a mismatch ends the run), and the run computes exactly
    what the calm one did: no iteration lost or trained twice."""

    def kill(record):
        pid = record["rollout_workers"][1]
        os.kill(pid, signal.SIGKILL)
        return {"pid": pid}

    thread, killed = when_first_row(tmp_path / "killed-ov", kill)
    run = small_train(quick_world, tmp_path, "killed-ov", 4, OVERLAP)
    thread.join(timeout=5)
    assert "pid" in killed
    assert json.loads((run / "actors.json").read_text())["rollout_workers"][1] != killed["pid"]
    rows = read_metrics(run)
    assert (run / "finished.json").is_file()
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    assert [r["weight_lag"] for r in rows] == [0, 1, 1, 1]
    last = rows[-1]
    # the first group, then one with the restarted worker (and one after any
    # broadcast the kill broke, whose version went by the object store)
    assert last["weight_groups_formed"] == 2 + last["weight_broadcast_failures"]
    assert [r["weight_versions"] for r in rows] == [r["weight_versions"] for r in calm_overlapped]
    assert _strip(rows) == _strip(calm_overlapped)
