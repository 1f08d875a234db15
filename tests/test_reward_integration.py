"""Reward servers as real processes over real HTTP, discovered through a real Redis."""

import os
import subprocess
import time

import pytest
from g2rpo.common.prompts.shapes import all_combinations, render_batch
from g2rpo.reward_server.client import NoReplicaAvailable, RewardClient, RewardRequestError
from g2rpo.reward_server.discovery import live_replicas
from g2rpo.reward_server.scorers.shapes_oracle import ShapesOracle
from servers import G2RPO, RedisServer, RewardServerProcess

SPECS = all_combinations()[::7]
IMAGES = render_batch(SPECS, seed=1)
PROMPTS = [s.prompt for s in SPECS]
SECRET = "9f2c4e1a7b3d5f60" * 4  # a reward token the server accepts (32 bytes or more)


@pytest.fixture(scope="module")
def redis_server():
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _clean_registry(redis_server):
    redis_server.client.flushall()


def _wait(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _server(redis_server, replica, ttl="1.5", scorers="shapes_oracle,jpeg_compressibility"):
    return RewardServerProcess(
        "--scorers",
        scorers,
        "--redis-url",
        redis_server.url,
        "--heartbeat-ttl",
        ttl,
        "--replica-id",
        replica,
    )


def test_register_heartbeat_expiry_and_deregister(redis_server):
    a = _server(redis_server, "rep-a")
    try:
        live = live_replicas(redis_server.client)
        assert [(r.replica, r.url) for r in live] == [("rep-a", a.url)]
        assert live[0].scorers == ["jpeg_compressibility", "shapes_oracle"]
        first = live[0].heartbeat
        assert _wait(lambda: live_replicas(redis_server.client)[0].heartbeat > first)
        assert live_replicas(redis_server.client, scorer="hpsv2") == []
    finally:
        a.stop()  # SIGTERM: deregisters at once
    assert _wait(lambda: live_replicas(redis_server.client) == [], timeout=2.0)
    b = _server(redis_server, "rep-b")
    b.kill()  # no goodbye: the key outlives the process until its TTL runs out
    assert [r.replica for r in live_replicas(redis_server.client)] == ["rep-b"]
    assert _wait(lambda: live_replicas(redis_server.client) == [], timeout=5.0)


def test_failover_when_a_replica_is_killed_mid_stream(redis_server):
    a, b = _server(redis_server, "rep-a", ttl="2"), _server(redis_server, "rep-b", ttl="2")
    expected = ShapesOracle().score(IMAGES, PROMPTS)
    try:
        with RewardClient(redis_url=redis_server.url, timeout_s=5, deadline_s=60) as client:
            first = [
                client.submit(IMAGES, PROMPTS, ["shapes_oracle"], f"req-{i}") for i in range(20)
            ]
            a.kill()
            rest = [
                client.submit(IMAGES, PROMPTS, ["shapes_oracle"], f"req-{i}") for i in range(20, 40)
            ]
            results = [f.result(timeout=60) for f in first + rest]
    finally:
        a.stop()
        b.stop()
    ids = [r.request_id for r in results]
    assert sorted(ids) == sorted(f"req-{i}" for i in range(40)) and len(set(ids)) == 40
    for r in results:
        assert r.scores["shapes_oracle"] == pytest.approx(expected.tolist())
    assert {r.replica for r in results[20:]} == {"rep-b"} or client.failovers > 0


def test_retry_on_another_replica_hits_the_shared_cache(redis_server):
    a = _server(redis_server, "rep-a")
    try:
        with RewardClient([a.url]) as client:
            first = client.score(IMAGES, PROMPTS, ["shapes_oracle", "jpeg_compressibility"])
        assert first.cached == {"shapes_oracle": 0, "jpeg_compressibility": 0}
    finally:
        a.kill()
    b = _server(redis_server, "rep-b")
    try:
        with RewardClient([b.url]) as client:
            again = client.score(IMAGES, PROMPTS, ["shapes_oracle", "jpeg_compressibility"])
    finally:
        b.stop()
    assert again.cached == {"shapes_oracle": len(PROMPTS), "jpeg_compressibility": len(PROMPTS)}
    assert again.scores == first.scores and again.replica == "rep-b"


def test_token_over_real_http():
    srv = RewardServerProcess(
        "--scorers", "jpeg_compressibility", "--token-env", "RS_TOKEN", env={"RS_TOKEN": SECRET}
    )
    try:
        with RewardClient([srv.url], deadline_s=5) as anonymous:
            with pytest.raises(RewardRequestError) as err:
                anonymous.score(IMAGES, PROMPTS, ["jpeg_compressibility"])
            assert err.value.status == 401
        with RewardClient([srv.url], token=SECRET) as client:
            assert len(
                client.score(IMAGES, PROMPTS, ["jpeg_compressibility"]).scores[
                    "jpeg_compressibility"
                ]
            ) == len(PROMPTS)
    finally:
        srv.stop()


def test_no_live_replica_is_a_clear_error_after_the_deadline(redis_server):
    start = time.monotonic()
    with (
        RewardClient(redis_url=redis_server.url, deadline_s=1.0) as client,
        pytest.raises(NoReplicaAvailable, match="no reward replica answered"),
    ):
        client.score(IMAGES, PROMPTS, ["shapes_oracle"])
    assert time.monotonic() - start < 10


def test_public_bind_without_token_is_refused_by_the_command():
    res = subprocess.run(
        [G2RPO, "reward-server", "--scorers", "jpeg_compressibility", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 2 and "--insecure" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run(
        [
            G2RPO,
            "reward-server",
            "--scorers",
            "jpeg_compressibility",
            "--token-env",
            "G2RPO_UNSET_VAR",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ},
    )
    assert res.returncode == 2 and "G2RPO_UNSET_VAR" in res.stderr


def test_openapi_fuzz_finds_no_server_error(tmp_path):
    import shutil

    srv = RewardServerProcess("--scorers", "shapes_oracle,jpeg_compressibility")
    try:
        exe = shutil.which("schemathesis") or os.path.join(os.path.dirname(G2RPO), "schemathesis")
        res = subprocess.run(
            [
                exe,
                "run",
                f"{srv.url}/openapi.json",
                "--checks",
                "not_a_server_error",
                "--max-examples",
                "60",
                "--request-timeout",
                "20",
                "--generation-deterministic",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            cwd=tmp_path,
        )
    finally:
        srv.stop()
    assert res.returncode == 0, res.stdout[-3000:]
    assert "/v1/score" in res.stdout
