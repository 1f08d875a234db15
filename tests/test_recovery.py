"""Failures inside a training run on a real local Ray, with real processes killed
(docs/design.md, Failures): the Redis control plane stopped mid-run and started
again empty; a rollout worker SIGKILLed under broadcast weights with overlapped
iterations; a learner rank SIGKILLed, its group formed again from the last
checkpoint (run.max_failures), and the run stopped quietly once they are spent."""

import json
import os
import signal
import subprocess
import time

import pytest
from g2rpo.orchestration.driver import read_metrics
from servers import G2RPO, RedisServer, RewardServerProcess, session_ray_env
from small_run import (
    OVERLAPPED_BROADCAST,
    PROMPTS_PER_WORKER,
    small_train,
    when_first_row,
    when_rows,
)

# a training run, a Ray cluster or a service: `pytest -m 'not slow'` leaves it out
pytestmark = pytest.mark.slow


def _strip(rows, *also):
    """What a run computed: no timings, not how weights travelled, no failure counts."""
    drop = ("weights_via", "weight_groups_formed", "weight_broadcast_failures", *also)
    return [
        {k: v for k, v in r.items() if not k.startswith("time/") and k not in drop} for r in rows
    ]


# ------------------------------------------- a rollout worker killed, overlapped


@pytest.fixture(scope="module")
def calm_overlapped(overlapped_run):
    """The uninterrupted overlapped run (a 2-learner group, weights by the object store,
    conftest)."""
    return read_metrics(overlapped_run)


def test_worker_killed_under_broadcast_weights_with_staleness_one(
    calm_overlapped, warm, world, scorer_url, tmp_path
):
    """train.weights.staleness=1 with train.weights.transport=collective, in a 2-learner
    group (FSDP2 over gloo: the full weights gathered from both ranks are broadcast):
    each version is broadcast while the next rollout may still run (the broadcast waits
    for the workers to be idle). A rollout worker SIGKILLed early in iteration 1 (while
    it rolls out on v0 beside the update) is restarted by Ray, loads the version its
    share was sampled with and redoes it, then the newest; the broadcast group is formed
    again with it. Every version and checksum check holds (a mismatch ends the run), and
    the run computes exactly what the calm overlapped run with weights by the object
    store did: no iteration lost or trained twice, whatever carried the weights. (This
    test took in test_training_group.py's worker killed under broadcast weights.)"""

    def kill(record):
        pid = record["rollout_workers"][1]
        os.kill(pid, signal.SIGKILL)
        return {"pid": pid}

    thread, killed = when_first_row(tmp_path / "killed-ov", kill)
    run = small_train(
        world, tmp_path, "killed-ov", 3, OVERLAPPED_BROADCAST, reward_url=scorer_url, warm=warm
    )
    thread.join(timeout=5)
    assert "pid" in killed
    actors = json.loads((run / "actors.json").read_text())
    assert actors["rollout_workers"][1] != killed["pid"]  # Ray restarted it
    assert len(actors["learners"]) == 2
    rows = read_metrics(run)
    assert (run / "finished.json").is_file()
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert [r["weight_lag"] for r in rows] == [0, 1, 1]
    assert {r["weights_via"] for r in rows} == {"collective"}
    # before the kill: one group, no failed broadcast
    assert (rows[0]["weight_groups_formed"], rows[0]["weight_broadcast_failures"]) == (1, 0)
    last = rows[-1]
    # the first group, then one with the restarted worker (and one after any
    # broadcast the kill broke, whose version went by the object store)
    assert last["weight_groups_formed"] == 2 + last["weight_broadcast_failures"]
    assert [r["weight_versions"] for r in rows] == [r["weight_versions"] for r in calm_overlapped]
    assert _strip(rows) == _strip(calm_overlapped)


# ------------------------------------------------------ a learner rank killed

TWO = ["train.learner.count=2"]


def _final_digest(run) -> str:
    """The exported weights' bytes (final/**/*.safetensors)."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted((run / "final").rglob("*.safetensors")):
        h.update(path.relative_to(run).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def calm_group(calm_group_run):
    """The uninterrupted 3-iteration run of a 2-learner group (FSDP2 over gloo, conftest)."""
    return read_metrics(calm_group_run), _final_digest(calm_group_run), calm_group_run


def test_learner_rank_death_stops_the_run_then_is_recovered_on_resume(
    calm_group, warm, world, tmp_path, capfd
):
    """As a user sees it: `g2rpo train` with run.max_failures=0, learner rank 1
    SIGKILLed after iteration 0. The run stops with one clear line that names the
    rank and says how to resume, and nothing else on stderr (no traceback from the
    surviving rank). Resumed with run.max_failures=1, rank 1 is SIGKILLed again after
    the resumed run's first row: the group is stopped with one line, formed again from
    the last checkpoint (train.checkpoints.every=1: at most one iteration redone) and
    the run goes on by itself. metrics.jsonl holds every iteration once, and the rows
    and the final weights equal the uninterrupted run's."""
    from g2rpo.orchestration.driver import train

    calm, calm_digest, calm_dir = calm_group
    run_dir = tmp_path / "stopped"
    cmd = [G2RPO, "train", "--no-progress", "--config", str(calm_dir / "config.yaml")]
    # the driver's own output (train.actor_logs would add the ranks' stderr to it)
    over = ("run.output_dir", tmp_path), ("run.name", "stopped"), ("run.max_failures", 0)
    for o in [*(f"{k}={v}" for k, v in over), "train.actor_logs=false"]:
        cmd += ["--set", o]
    env = session_ray_env()  # the run joins the tests' local Ray, as a job joins a cluster
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def kill(record):
        os.kill(record["learners"][1], signal.SIGKILL)
        return {"pids": record["learners"]}

    thread, killed = when_rows(run_dir, 1, kill)
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    thread.join(timeout=5)
    assert proc.returncode == 2, (out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]  # not even Ray's INFO lines
    assert len(lines) == 1, err
    (line,) = lines
    assert line.startswith(f"g2rpo: error: learner rank 1 (pid {killed['pids'][1]}) died in ")
    assert "run.max_failures=0" in line and f"g2rpo train --resume {run_dir}" in line
    assert "Traceback" not in out + err and "Unhandled error" not in out + err
    assert not (run_dir / "learner_failures.jsonl").exists()
    assert [r["iteration"] for r in read_metrics(run_dir)] == [0]

    # resumed from it_00001: its first row is iteration 1's, then rank 1 dies again
    thread, again = when_rows(run_dir, 2, kill)
    capfd.readouterr()
    train(None, ["run.max_failures=1"], resume=run_dir, progress=False, warm=warm)
    thread.join(timeout=5)
    err = capfd.readouterr().err
    assert "pids" in again
    rows = read_metrics(run_dir)
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert _strip(rows, "learner_restarts") == _strip(calm)
    assert _final_digest(run_dir) == calm_digest
    (event,) = [
        json.loads(ln) for ln in (run_dir / "learner_failures.jsonl").read_text().splitlines()
    ]
    assert event["rank"] == 1 and event["learner_restarts"] == 1
    assert event["resumed_from"] in (1, 2)  # it_00002 may have been mid-save
    redone = event["resumed_from"]
    assert [r.get("learner_restarts", 0) for r in rows] == [0] * redone + [1] * (3 - redone)
    new = json.loads((run_dir / "actors.json").read_text())["learners"]
    assert not set(new) & set(again["pids"])  # a new group of two
    assert f"learner rank 1 (pid {again['pids'][1]}) died" in err, err
    assert "formed again" in err
    assert "Traceback" not in err and "Unhandled error" not in err, err
    assert (run_dir / "finished.json").is_file()


# ------------------------------------------------------ a stop during the update


def test_a_stop_during_the_update_finishes_it_and_resumes_to_the_uninterrupted_run(
    calm_group, warm, world, scorer_url, tmp_path, monkeypatch, capfd
):
    """Ctrl-C (or `ray job stop`'s SIGTERM) lands while iteration 1's update runs on the
    learner group: the ranks apply it whatever the driver does, so the driver finishes
    the iteration (its row, its evaluation) and checkpoints it as it_00002 — not as
    it_00001, which would hold iteration 2's weights and make the resumed run skip an
    iteration. Resumed, the run equals the uninterrupted one, row for row, and its final
    weights too."""
    import ray
    from g2rpo.orchestration.driver import TrainingLoop, train
    from small_run import small_train

    calm, calm_digest, _ = calm_group
    real, stopped = TrainingLoop.learned, []
    real_start, sent = TrainingLoop.start_learning, []

    def stop_during_update(self, step):
        if step.iteration == 1 and not stopped:  # the signal arrives inside the wait
            stopped.append(step.update)
            raise KeyboardInterrupt
        return real(self, step)

    def start_learning(self, it, weights, summaries, trajectories, evaluation, clock):
        sent.extend(trajectories)
        return real_start(self, it, weights, summaries, trajectories, evaluation, clock)

    monkeypatch.setattr(TrainingLoop, "learned", stop_during_update)
    monkeypatch.setattr(TrainingLoop, "start_learning", start_learning)
    two = ["train.learner.count=2"]
    with pytest.raises(KeyboardInterrupt):
        small_train(world, tmp_path, "stopped", 3, two, reward_url=scorer_url, warm=warm)
    monkeypatch.undo()
    # the trajectories went to the learner ranks by reference: the driver held none
    assert sent and all(isinstance(t, ray.ObjectRef) for t in sent)
    run_dir = tmp_path / "stopped"
    err = capfd.readouterr().err
    assert "finishing iteration 1" in err and "interrupted after iteration 2" in err, err
    assert [r["iteration"] for r in read_metrics(run_dir)] == [0, 1]
    assert (run_dir / "checkpoints" / "it_00002.dcp" / "g2rpo.json").is_file()
    train(None, [], resume=run_dir, progress=False, warm=warm)
    rows = read_metrics(run_dir)
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert _strip(rows) == _strip(calm)
    assert _final_digest(run_dir) == calm_digest


# ------------------------------------------------------ Redis stopped mid-run
# (last: a 1-learner run after the 2-learner ones above, as the files after this one train;
# the warm pool keeps a group of each size while there is room for the run beside it)


def test_redis_discovery_status_and_export_with_redis_stopped_mid_run(warm, world, tmp_path):
    """Reward replicas are found in Redis, the run's status goes there and its metrics
    are exported for Prometheus (scraped after the first row). Redis is stopped after
    iteration 1 and started again, empty (no persistence), two iterations later: the
    workers keep scoring on the replica Redis listed last, `g2rpo status` reads the
    run directory meanwhile, the replica registers again, every iteration's row is in
    metrics.jsonl once, and the run's stream in Redis is whole again (rebuilt from
    metrics.jsonl), each iteration once: `g2rpo status NAME` reads it from Redis."""
    import httpx
    import redis as redis_py
    from g2rpo.orchestration.telemetry import STREAM_KEY, read_status

    redis = RedisServer()
    server = RewardServerProcess(
        "--scorers", f"shapes_clip={world / 'shapes_clip'}", "--redis-url", redis.url
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

    def scrape(record):
        port = int((run_dir / "metrics_port").read_text())
        return {"text": httpx.get(f"http://127.0.0.1:{port}/metrics").text}

    thread, _ = when_rows(run_dir, 2, outage)
    scraper, scraped = when_rows(run_dir, 1, scrape)
    try:
        small_train(
            world,
            tmp_path,
            "outage",
            6,
            ["train.reward.replicas=0", "train.checkpoints.every=100", "train.metrics.port=0"],
            redis_url=redis.url,
            warm=warm,
        )
        thread.join(timeout=30)
        scraper.join(timeout=30)
        text = scraped["text"]
        assert "g2rpo_train_iteration 0.0" in text
        assert 'g2rpo_train_reward{reward="shapes_clip"}' in text
        assert "g2rpo_train_model_evaluations_total" in text
        assert 'g2rpo_train_phase_seconds{phase="rollout"}' in text
        assert "g2rpo_train_weight_lag 0.0" in text
        assert "g2rpo_train_weight_broadcast_failures_total 0.0" in text
        rows = read_metrics(run_dir)
        assert [r["iteration"] for r in rows] == [0, 1, 2, 3, 4, 5]
        assert all(
            r["transitions"] == 2 * PROMPTS_PER_WORKER * 2 * 4 for r in rows
        )  # every prompt's share
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
        cli = [G2RPO, "status", "outage", "--redis-url", redis.url, "--json"]
        state = json.loads(subprocess.run(cli, capture_output=True, text=True, check=True).stdout)
        assert state["state"] == "finished" and state["last"]["iteration"] == 5
        assert state["iterations_in_stream"] == 6
        disk = subprocess.run([G2RPO, "status", str(run_dir)], capture_output=True, text=True)
        assert "last iteration 5" in disk.stdout and "it_00006.pt" in disk.stdout, disk
    finally:
        server.stop()
        redis.stop()
