"""Reward servers on Ray Serve (local Ray, real Redis, real HTTP through Serve's proxy):
the deployment registers in Redis and scores like any replica; under load a second
replica comes up, and after the load it goes away again."""

import threading
import time
import warnings

import numpy as np
import pytest
from g2rpo.reward_server.client import RewardClient
from g2rpo.reward_server.discovery import live_replicas
from g2rpo.reward_server.serve import ServeOptions, reward_application
from g2rpo.reward_server.settings import ScorerSpec, ServerSettings
from pydantic import ValidationError
from servers import RedisServer, free_port

# a training run, a Ray cluster or a service: `pytest -m 'not slow'` leaves it out
pytestmark = pytest.mark.slow

NAME = "g2rpo-reward-test"


@pytest.fixture(scope="module")
def serve_cluster(ray_local):
    from ray import serve

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    redis = RedisServer()
    try:
        yield f"http://127.0.0.1:{port}", redis
    finally:
        serve.shutdown()
        redis.stop()


def test_autoscaling_config_is_one_serve_takes_without_a_warning():
    """Serve warns (and is to refuse) a look-back window not longer than its metrics
    interval, and warns on deprecated fields: the config is built by Serve's own model and
    by its deployment decorator with every warning an error. No cluster is needed."""
    from ray import serve
    from ray.serve.config import AutoscalingConfig

    for options in (ServeOptions(), ServeOptions(min_replicas=0, max_replicas=2)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            config = AutoscalingConfig(**options.autoscaling_config())
            serve.deployment(name="probe", autoscaling_config=options.autoscaling_config())(
                type("Probe", (), {})
            )
        assert config.look_back_period_s > config.metrics_interval_s
        assert config.look_back_period_s == options.look_back_period_s
    with pytest.raises(ValidationError, match="look_back_period_s"):
        ServeOptions(look_back_period_s=2.0)


def _running(name: str) -> int:
    from ray import serve

    app = serve.status().applications.get(name)
    if app is None:
        return 0
    return app.deployments[name].replica_states.get("RUNNING", 0)


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.25)
    return predicate()


def test_serve_deployment_scores_and_autoscales(serve_cluster):
    from ray import serve

    proxy, redis = serve_cluster
    settings = ServerSettings(
        scorers=[ScorerSpec(name="shapes_oracle")],
        redis_url=redis.url,
        advertise_url=proxy,
        heartbeat_ttl_s=1.5,
        max_wait_ms=250.0,  # each request waits for its batch: requests pile up under load
    )
    options = ServeOptions(
        name=NAME,
        min_replicas=1,
        max_replicas=2,
        target_ongoing_requests=1.0,
        upscale_delay_s=0.5,
        downscale_delay_s=3.0,
        num_cpus=0.5,
    )
    serve.run(reward_application(settings, options), name=NAME, route_prefix="/", blocking=False)
    assert _wait(lambda: _running(NAME) == 1, 120)
    assert _wait(lambda: len(live_replicas(redis.client)) == 1, 60)
    entry = live_replicas(redis.client)[0]
    assert entry.url == proxy and entry.replica.startswith(f"{NAME}-")
    images = np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    prompts = ["a red circle on a blue background"] * 4
    with RewardClient(redis_url=redis.url) as client:  # found through Redis, as training does
        first = client.score(images, prompts, ["shapes_oracle"])
    assert len(first.scores["shapes_oracle"]) == 4 and first.replica == entry.replica

    stop = threading.Event()

    def load(seed: int) -> None:
        rng = np.random.default_rng(seed)
        with RewardClient([proxy], deadline_s=60) as c:
            while not stop.is_set():
                c.score(
                    rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8),
                    prompts[:2],
                    ["shapes_oracle"],
                )

    threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(8)]
    for t in threads:
        t.start()
    try:
        assert _wait(lambda: _running(NAME) == 2, 90), serve.status()
        assert _wait(lambda: len(live_replicas(redis.client)) == 2, 30)  # both registered
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert _wait(lambda: _running(NAME) == 1, 90), serve.status()
    assert _wait(lambda: len(live_replicas(redis.client)) == 1, 30)
    serve.delete(NAME)
    assert _wait(lambda: live_replicas(redis.client) == [], 30)
