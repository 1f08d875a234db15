"""HTTPS between reward clients and servers, with a throwaway CA made here (tls_files.py):
a server given --tls-cert/--tls-key serves HTTPS and registers an https:// URL; a client
given the CA (train.reward.tls_ca_file) scores; one without it fails at once naming that
field; plain HTTP to the TLS port gets nothing. (At 3bb9114 there was no TLS: the token,
images and prompts crossed the network in clear.)"""

import subprocess
import time

import httpx
import pytest
from g2rpo.common.config.loading import load_config
from g2rpo.common.errors import ConfigError, UsageError
from g2rpo.common.prompts.shapes import all_combinations, render_batch
from g2rpo.orchestration.reward_check import served_by_urls
from g2rpo.reward_server.client import RewardClient
from g2rpo.reward_server.discovery import ReplicaInfo, deregister, live_replicas, register
from g2rpo.reward_server.scorers.shapes_oracle import ShapesOracle
from g2rpo.reward_server.serve import proxy_options
from g2rpo.reward_server.settings import ScorerSpec, ServerSettings
from g2rpo.reward_server.tls import RewardTLSError, check_server_tls
from servers import G2RPO, RedisServer, RewardServerProcess
from tls_files import make_tls_files

SECRET = "5d0e8c2b4a6f1379" * 4  # a reward token the server accepts
SPECS = all_combinations()[::11]
IMAGES = render_batch(SPECS, seed=4)
PROMPTS = [s.prompt for s in SPECS]


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return make_tls_files(tmp_path_factory.mktemp("tls"), ["127.0.0.1", "localhost"])


@pytest.fixture(scope="module")
def redis_server():
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def https_server(tls, redis_server):
    srv = RewardServerProcess(
        "--scorers",
        "shapes_oracle",
        "--tls-cert",
        str(tls.cert),
        "--tls-key",
        str(tls.key),
        "--token-env",
        "RS_TOKEN",
        "--redis-url",
        redis_server.url,
        "--replica-id",
        "tls-a",
        env={"RS_TOKEN": SECRET},
        ca_file=str(tls.ca),
    )
    yield srv
    srv.stop()


def test_a_client_given_the_ca_scores_over_https(tls, redis_server, https_server):
    assert https_server.url.startswith("https://127.0.0.1:")
    # the URL it advertises in Redis is the https:// one
    (entry,) = live_replicas(redis_server.client)
    assert (entry.replica, entry.url) == ("tls-a", https_server.url)
    expected = ShapesOracle().score(IMAGES, PROMPTS).tolist()
    with RewardClient([https_server.url], token=SECRET, ca_file=str(tls.ca)) as client:
        got = client.score(IMAGES, PROMPTS, ["shapes_oracle"])
    assert got.scores["shapes_oracle"] == pytest.approx(expected) and got.replica == "tls-a"
    # found through Redis, as a run's workers find it
    with RewardClient(redis_url=redis_server.url, token=SECRET, ca_file=str(tls.ca)) as client:
        again = client.score(IMAGES, PROMPTS, ["shapes_oracle"])
    assert again.scores == got.scores
    # the driver's start-up check reaches it with the same CA
    assert served_by_urls([https_server.url], SECRET, str(tls.ca)) == ({"shapes_oracle"}, [])


@pytest.mark.parametrize("trusted", ["system", "other"])
def test_a_client_without_the_ca_fails_at_once_naming_tls_ca_file(tls, https_server, trusted):
    ca_file = None if trusted == "system" else str(tls.other_ca)
    start = time.monotonic()
    with (
        RewardClient([https_server.url], token=SECRET, ca_file=ca_file, deadline_s=60) as client,
        pytest.raises(RewardTLSError) as err,
    ):
        client.score(IMAGES, PROMPTS, ["shapes_oracle"])
    message = str(err.value)
    assert message.startswith(f"the reward server at {https_server.url} presented a certificate")
    assert "train.reward.tls_ca_file" in message
    assert time.monotonic() - start < 10  # not failed over until the 60 s deadline
    with pytest.raises(RewardTLSError, match=r"train.reward.tls_ca_file"):
        served_by_urls([https_server.url], SECRET, ca_file)  # the driver's check: at once too


def test_a_client_given_the_ca_never_sends_to_a_plain_registration(tls, redis_server, https_server):
    """A forged registration in Redis (an http:// URL beside the real https:// replica)
    would get the token and images in clear: a client with a CA bundle skips it."""
    plain = RewardServerProcess("--scorers", "shapes_oracle")  # loopback, no token, no TLS
    try:
        forged = ReplicaInfo(replica="forged", url=plain.url, scorers=["shapes_oracle"])
        register(redis_server.client, forged, ttl_s=60)
        with RewardClient(redis_url=redis_server.url, token=SECRET, ca_file=str(tls.ca)) as c:
            answers = [c.score(IMAGES, PROMPTS, ["shapes_oracle"]) for _ in range(4)]
        assert {a.replica for a in answers} == {"tls-a"}
        # the plain server never got a scoring request (its counter has no sample yet)
        assert "g2rpo_reward_requests_total{" not in httpx.get(f"{plain.url}/metrics").text
        with pytest.raises(ConfigError, match=r"train\.reward\.urls"):
            RewardClient([plain.url], ca_file=str(tls.ca))  # nor a static one
    finally:
        deregister(redis_server.client, "forged")
        plain.stop()


def test_plain_http_to_the_tls_port_gets_no_answer(https_server):
    plain = https_server.url.replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{plain}/readyz", timeout=5.0)
    with pytest.raises(httpx.HTTPError):  # the token sent in clear is not answered either
        httpx.get(f"{plain}/v1/scorers", headers={"Authorization": f"Bearer {SECRET}"})


def test_tls_settings_name_the_flag_or_field_at_fault(tls, tmp_path):
    cert, key = str(tls.cert), str(tls.key)
    with pytest.raises(UsageError, match=r"^--tls-cert is given without --tls-key"):
        check_server_tls(cert, None)
    with pytest.raises(UsageError, match=r"^--tls-key is given without --tls-cert"):
        check_server_tls(None, key)
    missing = str(tmp_path / "nowhere.pem")
    with pytest.raises(UsageError, match=rf"^--tls-key {missing}: no such file"):
        check_server_tls(cert, missing)
    with pytest.raises(UsageError, match=r"^--tls-cert .* not a PEM certificate and its key"):
        check_server_tls(cert, str(tls.ca))  # a certificate is not the key
    with pytest.raises(ConfigError, match=r"^train.reward.tls_cert_file .*: no such file"):
        check_server_tls(missing, key, "train.reward.tls_cert_file", "train.reward.tls_key_file")
    with pytest.raises(ConfigError, match=r"tls_cert_file is given without train.reward.tls_key"):
        load_config(None, [f"train.reward.tls_cert_file={cert}"])
    with pytest.raises(ConfigError, match=rf"^train.reward.tls_ca_file {missing}: no such file"):
        RewardClient(["https://127.0.0.1:1"], ca_file=missing)
    settings = ServerSettings(
        scorers=[ScorerSpec(name="shapes_oracle")],
        tls_cert_file=cert,
        tls_key_file=key,
        advertise_url="http://head:8000",
    )
    with pytest.raises(UsageError, match=r"^--advertise-url http://head:8000: this server speaks"):
        settings.check_tls()
    res = subprocess.run(
        [G2RPO, "reward-server", "--scorers", "shapes_oracle", "--tls-cert", cert],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "--tls-cert is given without --tls-key" in res.stderr


def test_ray_serve_proxy_takes_the_certificate(tls):
    """Serve's HTTP proxy serves HTTPS through its own ssl options (HTTPOptions)."""
    plain = ServerSettings(scorers=[ScorerSpec(name="shapes_oracle")], host="0.0.0.0", port=8000)
    assert proxy_options(plain, 8000) == {"host": "0.0.0.0", "port": 8000}
    https = plain.model_copy(update={"tls_cert_file": str(tls.cert), "tls_key_file": str(tls.key)})
    assert proxy_options(https, 8000) == {
        "host": "0.0.0.0",
        "port": 8000,
        "ssl_certfile": str(tls.cert),
        "ssl_keyfile": str(tls.key),
    }
    assert https.url() == "https://0.0.0.0:8000"


@pytest.mark.slow
def test_a_jobs_replicas_serve_https_and_register_in_a_locked_redis(
    ray_local, tmp_path, monkeypatch
):
    """The replicas a job starts (Ray actors) take train.reward.tls_cert_file/tls_key_file
    and the Redis password the driver read (in memory: RewardSource → RewardReplica), and
    register their https:// URL in a Redis that requires it; a rollout worker's own client
    (train.reward.tls_ca_file, RewardEndpoints' password) scores there."""
    import ray
    from g2rpo.common.cluster.redis_access import RedisPassword
    from g2rpo.common.config.loading import dump_config
    from g2rpo.reward_server.replicas import RewardSource
    from g2rpo.rollout_worker.worker import RolloutWorkerCore

    node = ray.util.get_node_ip_address()  # where the replica binds: the certificate names it
    files = make_tls_files(tmp_path, [node, "127.0.0.1"])
    password = "e1b7c9d3f5a20486" * 2
    locked = RedisServer(password=password)
    monkeypatch.setenv("G2RPO_REDIS_PASSWORD", password)
    monkeypatch.setenv("G2RPO_TEST_REWARD_TOKEN", SECRET)  # shared: the replica registers
    cfg = load_config(
        None,
        [
            "rewards=[{name: shapes_oracle}]",
            "train.reward.replicas=1",
            f"train.reward.redis_url={locked.url}",
            "train.reward.token_env=G2RPO_TEST_REWARD_TOKEN",
            "train.reward.redis_password_env=G2RPO_REDIS_PASSWORD",
            f"train.reward.tls_cert_file={files.cert}",
            f"train.reward.tls_key_file={files.key}",
            f"train.reward.tls_ca_file={files.ca}",
        ],
    )
    assert password not in dump_config(cfg)  # config.yaml holds the variable's name only
    source = RewardSource(cfg, None)
    try:
        source.refresh(timeout=300, strict=True)
        (url,) = source.replica_urls
        assert url.startswith(f"https://{node}:")
        assert [r.url for r in live_replicas(locked.client)] == [url]
        endpoints = source.endpoints()
        assert endpoints.redis_password == RedisPassword(password, "G2RPO_REDIS_PASSWORD")
        worker = RolloutWorkerCore.__new__(RolloutWorkerCore)  # its client builder only
        worker.cfg, worker.client, worker.client_urls = cfg, None, ()
        client = worker._reward_client(endpoints)
        try:
            got = client.score(IMAGES, PROMPTS, endpoints.scorers)
        finally:
            client.close()
        expected = ShapesOracle().score(IMAGES, PROMPTS).tolist()
        assert got.scores["shapes_oracle"] == pytest.approx(expected)
        with (
            RewardClient([url], token=SECRET, deadline_s=30) as untrusting,
            pytest.raises(RewardTLSError, match=r"train\.reward\.tls_ca_file"),
        ):
            untrusting.score(IMAGES, PROMPTS, ["shapes_oracle"])
    finally:
        source.close()
        locked.stop()
