"""A FLUX-size batch scored through the reward service: the client cuts it into requests
the server takes (a worker's 193 leaves of 720² are 286 MiB, an evaluation's 400 images
593 MiB, the server's body limit 64 MiB by default), sends them concurrently and merges
the answers in the images' order; a server whose limit is below the client's is answered
by halving the refused requests; one image over the limit is an error naming the fields."""

import math
import re
import subprocess

import httpx
import numpy as np
import pytest
from g2rpo.reward_server.client import RewardClient, RewardRequestError
from g2rpo.reward_server.request_chunks import (
    HEADER_ALLOWANCE_BYTES,
    chunk_ranges,
    images_per_request,
    merge_responses,
    prompt_bytes,
    server_limit,
)
from g2rpo.reward_server.schemas import ScoreResponse
from g2rpo.reward_server.scorers.jpeg import JpegCompressibility
from servers import G2RPO, RewardServerProcess, session_ray_env

MiB = 2**20
SIDE = 720  # FLUX recipes' image size
SCORER = "jpeg_compressibility"  # no model to load; about 10 ms an image at 720²


def flux_size_batch(count: int, seed: int = 0) -> np.ndarray:
    """``count`` distinct 720² uint8 images: black (pages never written: cheap to make
    and to read) under a band of random noise rows whose height varies, so that their
    JPEG sizes (the scores) differ."""
    rng = np.random.default_rng(seed)
    images = np.zeros((count, SIDE, SIDE, 3), dtype=np.uint8)
    noise = rng.integers(0, 256, (count + 104, SIDE, 3), dtype=np.uint8)
    for i in range(count):
        rows = 8 + (i * 37) % 97
        images[i, :rows] = noise[i : i + rows]
    return images


# ------------------------------------------------------------------ chunking arithmetic
def test_a_flux_workers_leaves_go_as_requests_of_at_most_32_mib():
    image = SIDE * SIDE * 3
    per = images_per_request(image, prompt_bytes(["a photo of a cat"]), 32 * MiB)
    assert per == 21  # 21 · 1.48 MiB + prompts + 16 KiB of headers ≤ 32 MiB < 22 images
    assert per * (image + 19) + HEADER_ALLOWANCE_BYTES <= 32 * MiB
    assert (per + 1) * image > 32 * MiB - HEADER_ALLOWANCE_BYTES
    for count, requests in ((193, 10), (400, 20)):
        ranges = chunk_ranges(count, per)
        assert len(ranges) == requests
        assert [lo for lo, _ in ranges[1:]] == [hi for _, hi in ranges[:-1]]  # in order
        assert ranges[0][0] == 0 and ranges[-1][1] == count
        sizes = [hi - lo for lo, hi in ranges]
        assert max(sizes) <= per and max(sizes) - min(sizes) <= 1  # balanced


def test_chunk_ranges_cover_the_batch_in_order_in_as_few_ranges_as_allowed():
    for count in range(0, 60):
        for per in range(1, 25):
            ranges = chunk_ranges(count, per)
            assert len(ranges) == max(1, math.ceil(count / per))
            assert [i for lo, hi in ranges for i in range(lo, hi)] == list(range(count))
            assert all(hi - lo <= per for lo, hi in ranges)


def test_one_image_is_a_request_however_small_the_bound():
    assert images_per_request(SIDE * SIDE * 3, 20, 1 * MiB) == 1
    assert images_per_request(10, 0, 10) == 1  # a bound below the header allowance


def test_prompt_bytes_bound_the_prompts_json():
    prompts = ["a cat", 'a "quoted" dog', "ein Bär unter 🌲"]
    assert prompt_bytes(prompts) >= max(len(p.encode()) + 3 for p in prompts)
    assert prompt_bytes([]) == 0


def test_merged_answer_is_the_one_a_single_request_would_have_had():
    def part(scores, cached, replica, ms):
        return ScoreResponse(
            request_id="x",
            scores={"a": scores, "b": [-s for s in scores]},
            versions={"a": "1", "b": "2"},
            cached={"a": cached, "b": 0},
            timings_ms={"decode": ms, "total": 2 * ms},
            replica=replica,
        )

    merged = merge_responses([part([1, 2], 2, "r1", 1.0), part([3], 0, "r2", 3.0)], "it0-w1")
    assert merged.request_id == "it0-w1"
    assert merged.scores == {"a": [1, 2, 3], "b": [-1, -2, -3]}
    assert merged.versions == {"a": "1", "b": "2"}
    assert merged.cached == {"a": 2, "b": 0}  # images answered from the cache, summed
    assert merged.timings_ms == {"decode": 4.0, "total": 8.0}  # server time, summed
    assert merged.replica == "r1,r2"


def test_the_servers_limit_is_read_from_its_413():
    assert server_limit("request body exceeds 4194304 bytes") == 4 * MiB
    assert server_limit("images: 2000 images exceed 1024") is None


def test_a_body_limit_below_one_kib_is_refused_naming_the_flag():
    res = subprocess.run(
        [G2RPO, "reward-server", "--scorers", SCORER, "--max-payload-mib", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 2 and "--max-payload-mib 0" in res.stderr
    assert "Traceback" not in res.stderr


# ------------------------------------------------------------------ real servers
@pytest.fixture(scope="module")
def served():
    """``g2rpo reward-server`` at its default 64 MiB body limit and at
    ``--max-payload-mib 4``, and the batch: 400 images (an evaluation's; the first 193
    are a worker's leaves) and their scores computed here while the servers start."""
    servers = {
        "default": RewardServerProcess("--scorers", SCORER, quiet=True, ready=False),
        "4 MiB": RewardServerProcess(
            "--scorers", SCORER, "--max-payload-mib", "4", quiet=True, ready=False
        ),
    }
    try:
        images = flux_size_batch(400)
        prompts = [f"prompt {i // 8}" for i in range(len(images))]
        expected = JpegCompressibility().score(images, prompts).tolist()
        for server in servers.values():
            server.wait_ready()
        yield servers, (images, prompts, expected)
    finally:
        for server in servers.values():
            server.stop()


def _requests_answered(url: str, status: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    found = re.search(rf'g2rpo_reward_requests_total{{status="{status}"}} (\S+)', text)
    return float(found.group(1)) if found else 0.0


@pytest.mark.slow
def test_a_workers_leaves_and_an_evaluation_are_scored_in_bounded_requests(served):
    servers, (images, prompts, expected) = served
    url = servers["default"].url
    per = 21  # test_a_flux_workers_leaves_go_as_requests_of_at_most_32_mib
    with RewardClient([url], request_bytes=32 * MiB, concurrency=4) as client:
        # a FLUX worker's 193 leaves (286 MiB), then an evaluation's 400 images (593 MiB)
        for count, request_id in ((193, "it0-w0"), (400, "eval-0")):
            before = _requests_answered(url, "200")
            got = client.score(images[:count], prompts[:count], [SCORER], request_id)
            sent = client.last_requests
            assert got.scores[SCORER] == pytest.approx(expected[:count])  # one each, in order
            assert got.request_id == request_id
            # the evaluation's first 193 were the worker's: the server's cache answers them
            assert got.cached == {SCORER: 0 if count == 193 else 193}
            # several requests, each within the bound, and the server saw just those
            assert len(sent) == math.ceil(count / per) > 1
            assert _requests_answered(url, "200") - before == len(sent)
            assert all(r.status == 200 and r.body_bytes <= 32 * MiB for r in sent)
            assert [(r.first, r.first + r.images) for r in sent] == chunk_ranges(count, per)


@pytest.mark.slow
def test_a_server_with_a_lower_limit_is_answered_by_splitting_the_refused_requests(served):
    servers, (images, prompts, expected) = served
    url = servers["4 MiB"].url
    with RewardClient([url], request_bytes=32 * MiB, concurrency=4) as client:
        got = client.score(images[:193], prompts[:193], [SCORER])
        first = client.last_requests
        # the limit the server named (its --max-payload-mib) cuts the next batches at once
        assert client.server_limit_bytes == 4 * MiB
        again = client.score(images[193:233], prompts[193:233], [SCORER])
        second = client.last_requests
    assert got.scores[SCORER] == pytest.approx(expected[:193])
    assert again.scores[SCORER] == pytest.approx(expected[193:233])
    refused = [r for r in first if r.status == 413]
    accepted = [r for r in first + second if r.status == 200]
    # the requests in flight when the first 413 came are refused too; the rest are cut
    # to the limit it named before they are sent
    assert 1 <= len(refused) <= 10 and all(r.body_bytes > 4 * MiB for r in refused)
    assert all(r.body_bytes <= 4 * MiB for r in accepted)
    assert sum(r.images for r in first if r.status == 200) == 193
    assert all(r.status == 200 for r in second) and len(second) == math.ceil(40 / 2)
    assert _requests_answered(url, "413") == len(refused)


@pytest.mark.slow
def test_one_image_over_the_servers_limit_names_request_mib(served):
    servers, _ = served
    big = np.zeros((1, 1200, 1200, 3), dtype=np.uint8)  # 4.1 MiB: over the 4 MiB limit
    with (
        RewardClient([servers["4 MiB"].url]) as client,
        pytest.raises(RewardRequestError) as err,
    ):
        client.score(big, ["one big image"], [SCORER])
    message = str(err.value)
    assert err.value.status == 413
    assert "1200x1200" in message and str(4 * MiB) in message  # the image, the limit
    assert "train.reward.request_mib" in message and "--max-payload-mib" in message


@pytest.mark.slow
def test_a_jobs_replicas_take_its_limit_and_its_workers_its_bounds(ray_local):
    """train.reward.max_payload_mib reaches the replicas a job starts (RewardSource →
    RewardReplica → ServerSettings), train.reward.request_mib and concurrency the
    client a rollout worker builds."""
    from g2rpo.common.config.loading import load_config
    from g2rpo.reward_server.replicas import RewardSource
    from g2rpo.rollout_worker.worker import RolloutWorkerCore

    cfg = load_config(
        None,
        [
            f"rewards=[{{name: {SCORER}}}]",
            "train.reward.replicas=1",
            "train.reward.max_payload_mib=4",
            "train.reward.request_mib=3",
            "train.reward.concurrency=2",
        ],
    )
    images = flux_size_batch(24, seed=1)
    prompts = [f"prompt {i}" for i in range(len(images))]
    expected = JpegCompressibility().score(images, prompts).tolist()
    source = RewardSource(cfg, None)
    try:
        source.refresh(timeout=300, strict=True)
        endpoints = source.endpoints()
        # the worker's own client builder, on a worker without its pipeline
        worker = RolloutWorkerCore.__new__(RolloutWorkerCore)
        worker.cfg, worker.client, worker.client_urls = cfg, None, ()
        client = worker._reward_client(endpoints)
        try:
            assert (client.request_bytes, client.concurrency) == (3 * MiB, 2)
            got = client.score(images, prompts, endpoints.scorers, "it0-w0")
            sent = client.last_requests
        finally:
            client.close()
        assert got.scores[SCORER] == pytest.approx(expected)
        assert len(sent) == 12  # two 720² images in 3 MiB
        assert all(r.status == 200 and r.body_bytes <= 3 * MiB for r in sent)
        # a client sending more is refused at the replica's limit, which it then names
        with RewardClient(endpoints.urls, token=endpoints.token) as bigger:
            again = bigger.score(images, prompts, endpoints.scorers)
            assert bigger.server_limit_bytes == 4 * MiB
        assert again.scores == got.scores
        assert any(r.status == 413 for r in bigger.last_requests)
    finally:
        source.close()


def test_a_refused_request_crosses_a_process_boundary_whole():
    """Ray hands a worker's exception to the driver pickled: a 4xx must arrive as itself
    (the CLI prints it as one line), not as "Failed to deserialize exception", which is
    how the 413 of `g2rpo rehearse` on the parent commit's client reached the driver."""
    import pickle

    from g2rpo.reward_server.client import RewardRequestError

    sent = RewardRequestError(413, "request body exceeds 67108864 bytes")
    got = pickle.loads(pickle.dumps(sent))
    assert type(got) is RewardRequestError and (got.status, got.detail) == (
        sent.status,
        sent.detail,
    )
    assert str(got) == str(sent)


@pytest.mark.slow
def test_a_scorer_no_replica_serves_stops_train_before_any_model_loads(ray_local, tmp_path):
    """README's own example, as a new user runs it: `g2rpo train --redis-url URL` where
    no reward replica is registered. It used to start every actor, wait 300 s in the
    first rollout and die with a bare NoReplicaAvailable traceback; now it says in one
    line, before any actor starts, which scorer has no replica and where it looked."""
    import time

    from servers import RedisServer

    redis = RedisServer()
    try:
        cmd = [G2RPO, "train", "--no-progress", "--config", "configs/tiny.yaml"]
        cmd += ["--redis-url", redis.url, "--set", f"run.output_dir={tmp_path}"]
        cmd += ["--set", "train.reward.deadline_s=3"]  # how long replicas may take to appear
        env = session_ray_env()  # joins the tests' local Ray, as a job joins a cluster
        t0 = time.monotonic()
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        took = time.monotonic() - t0
    finally:
        redis.stop()
    assert res.returncode == 2, res.stderr[-3000:]
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("g2rpo: error:")]
    assert "train.reward: no reward replica serves ['shapes_clip', 'shapes_oracle']" in line
    assert redis.url in line and "Traceback" not in res.stderr
    assert took < 60  # the CLI's start and the 3 s wait, not a rollout's 300 s deadline
