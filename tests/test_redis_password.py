"""A Redis that requires a password (redis-server --requirepass, as the deployments run
it): servers register and share their cache there, clients discover them, the driver
publishes a run's status and `g2rpo status` reads it, all with the password from the
environment variable a flag or train.reward.redis_password_env names. A missing, wrong
or unset password is an error saying which setting to change, never an outage waited
out: at 3bb9114 no client could send a password, and redis-py's AuthenticationError is
a ConnectionError, which every caller took for "Redis away, carry on"."""

import json
import os
import secrets
import subprocess
import time

import pytest
from g2rpo.common.cluster.redis_access import RedisAuthError, RedisPassword, connect_redis
from g2rpo.common.config.loading import load_config
from g2rpo.common.errors import ConfigError, UsageError
from g2rpo.common.prompts.shapes import all_combinations, render_batch
from g2rpo.orchestration.reward_check import served_in_redis
from g2rpo.orchestration.telemetry import RedisStatus, read_status
from g2rpo.reward_server.client import RewardClient
from g2rpo.reward_server.discovery import live_replicas
from g2rpo.reward_server.scorers.shapes_oracle import ShapesOracle
from servers import G2RPO, RedisServer, RewardServerProcess

PASSWORD = secrets.token_hex(16)
VAR = "G2RPO_REDIS_PASSWORD"  # the deployments' name (Secret redis-password, key password)
SPECS = all_combinations()[::9]
IMAGES = render_batch(SPECS, seed=3)
PROMPTS = [s.prompt for s in SPECS]


@pytest.fixture(scope="module")
def locked():
    server = RedisServer(password=PASSWORD)
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _empty(locked):
    locked.client.flushall()


def _needs_password(url: str) -> str:
    return (
        f"Redis at {url} requires a password: set train.reward.redis_password_env (or "
        "--redis-password-env) to the env var holding it"
    )


def _g2rpo(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [G2RPO, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


def _error_line(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    return res.stderr.strip().splitlines()[-1]


def test_servers_register_share_their_cache_and_are_found_with_the_password(locked):
    srv = RewardServerProcess(
        "--scorers",
        "shapes_oracle",
        "--redis-url",
        locked.url,
        "--redis-password-env",
        VAR,
        "--replica-id",
        "locked-a",
        env={VAR: PASSWORD},
    )
    try:
        assert [(r.replica, r.url) for r in live_replicas(locked.client)] == [("locked-a", srv.url)]
        # the driver's start-up check finds its scorers there
        assert served_in_redis(locked.url, RedisPassword(PASSWORD, VAR)) == ({"shapes_oracle"}, [])
        with RewardClient(
            redis_url=locked.url, redis_password=RedisPassword(PASSWORD, VAR), deadline_s=60
        ) as client:
            got = client.score(IMAGES, PROMPTS, ["shapes_oracle"])
        assert got.replica == "locked-a"
        assert got.scores["shapes_oracle"] == pytest.approx(
            ShapesOracle().score(IMAGES, PROMPTS).tolist()
        )
        # the shared score cache went to the locked Redis: one entry per image
        assert len(list(locked.client.scan_iter("g2rpo:score:shapes_oracle:*"))) == len(PROMPTS)
    finally:
        srv.stop()
    assert PASSWORD not in srv.output_tail()  # not in what the server printed


def test_a_server_without_the_password_names_the_setting(locked):
    res = _g2rpo("reward-server", "--scorers", "shapes_oracle", "--redis-url", locked.url)
    assert _error_line(res) == f"g2rpo: error: {_needs_password(locked.url)}"


def test_a_client_without_the_password_fails_at_once_naming_the_setting(locked):
    start = time.monotonic()
    with (
        RewardClient(redis_url=locked.url, deadline_s=60) as client,
        pytest.raises(RedisAuthError) as err,
    ):
        client.score(IMAGES, PROMPTS, ["shapes_oracle"])
    assert str(err.value) == _needs_password(locked.url)
    assert time.monotonic() - start < 10  # not the 60 s deadline of an outage


def test_a_wrong_password_names_its_variable_wherever_it_is_used(locked, tmp_path):
    wrong = RedisPassword(secrets.token_hex(16), VAR)
    refused = f"Redis at {locked.url} refused the password in {VAR}"
    with (
        RewardClient(redis_url=locked.url, redis_password=wrong, deadline_s=60) as client,
        pytest.raises(RedisAuthError, match=refused),
    ):
        client.score(IMAGES, PROMPTS, ["shapes_oracle"])
    # the driver's status publisher: an error, not an outage it waits out
    status = RedisStatus(locked.url, "run-w", wrong)
    with pytest.raises(RedisAuthError, match=refused):
        status.publish({"iteration": 0}, tmp_path)
    res = _g2rpo(
        "status",
        "--redis-url",
        locked.url,
        "--redis-password-env",
        VAR,
        env={VAR: wrong.value},
    )
    line = _error_line(res)
    assert line.startswith(f"g2rpo: error: {refused}") and wrong.value not in res.stderr


def test_an_unset_password_variable_is_named(monkeypatch, locked):
    monkeypatch.delenv("G2RPO_UNSET_PASSWORD", raising=False)
    for command in (
        ["status", "--redis-url", locked.url],
        ["reward-server", "--scorers", "shapes_oracle", "--redis-url", locked.url],
        ["train", "--config", "configs/tiny.yaml", "--redis-url", locked.url],  # before Ray
    ):
        res = _g2rpo(*command, "--redis-password-env", "G2RPO_UNSET_PASSWORD")
        assert _error_line(res).startswith(
            "g2rpo: error: --redis-password-env G2RPO_UNSET_PASSWORD: the environment "
            "variable is unset or empty"
        )
    # the driver, from the config field, before any actor (external replicas: no Ray)
    from g2rpo.reward_server.replicas import RewardSource

    monkeypatch.setenv("G2RPO_EMPTY_PASSWORD", "")
    cfg = load_config(
        None,
        [
            f"train.reward.redis_url={locked.url}",
            "train.reward.redis_password_env=G2RPO_EMPTY_PASSWORD",
        ],
    )
    with pytest.raises(ConfigError) as err:
        RewardSource(cfg, None)
    assert str(err.value).startswith(
        "train.reward.redis_password_env G2RPO_EMPTY_PASSWORD: the environment variable is "
        "unset or empty"
    )


def test_the_driver_checks_the_password_before_any_actor(monkeypatch, locked):
    from g2rpo.reward_server.replicas import RewardSource

    cfg = load_config(None, [f"train.reward.redis_url={locked.url}"])
    with pytest.raises(RedisAuthError) as err:
        RewardSource(cfg, None)
    assert str(err.value) == _needs_password(locked.url)
    monkeypatch.setenv(VAR, PASSWORD)
    cfg = load_config(
        None, [f"train.reward.redis_url={locked.url}", f"train.reward.redis_password_env={VAR}"]
    )
    source = RewardSource(cfg, None)  # no replicas of its own: nothing to start
    endpoints = source.endpoints()
    assert endpoints.redis_password == RedisPassword(PASSWORD, VAR)
    assert PASSWORD not in repr(endpoints) and PASSWORD not in repr(endpoints.redis_password)
    assert PASSWORD not in endpoints.redis_url


def test_a_runs_status_is_published_and_read_back_with_the_password(locked, tmp_path):
    password = RedisPassword(PASSWORD, VAR)
    row = {"iteration": 4, "version": 5, "reward/shapes_oracle": 0.75}
    RedisStatus(locked.url, "locked-run", password).publish(row, tmp_path)
    state = read_status("locked-run", locked.url, password)
    assert (state["state"], state["last"], state["iterations_in_stream"]) == ("running", row, 1)
    res = _g2rpo(
        "status",
        "locked-run",
        "--redis-url",
        locked.url,
        "--redis-password-env",
        VAR,
        "--json",
        env={VAR: PASSWORD},
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["last"] == row
    with pytest.raises(RedisAuthError, match="requires a password"):
        read_status("locked-run", locked.url)  # not read from disk as if Redis were away


def test_a_password_in_the_url_is_refused_since_urls_are_printed():
    with pytest.raises(UsageError) as err:
        connect_redis(f"redis://:{PASSWORD}@127.0.0.1:6390/0")
    assert "redis_password_env" in str(err.value) and PASSWORD not in str(err.value)
