"""The reward app in process (real FastAPI app through its ASGI test client). Behind a
real uvicorn: tests/test_reward_app_http.py."""

import asyncio
import io
import json
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient
from g2rpo.reward_server.app import create_app
from g2rpo.reward_server.schemas import SAFETENSORS_TYPE, ScoreResponse
from g2rpo.reward_server.scorers.jpeg import JpegCompressibility
from g2rpo.reward_server.scorers.shapes_oracle import ShapesOracle
from g2rpo.reward_server.settings import ScorerSpec, ServerSettings
from g2rpo.reward_server.wire import decode_pngs, encode_png, encode_safetensors
from PIL import Image
from reward_app_inputs import IMAGES, PROMPTS, SECRET, _settings
from safetensors.numpy import save


@pytest.fixture
def client():
    with TestClient(create_app(_settings(max_side=64, max_images=16))) as c:
        yield c


def _post(
    client,
    images=IMAGES,
    prompts=PROMPTS,
    scorers=("shapes_oracle",),
    raw=None,
    headers=None,
    request=None,
):
    import json

    files = (
        raw
        if raw is not None
        else {"images": ("b.safetensors", encode_safetensors(images), SAFETENSORS_TYPE)}
    )
    header = (
        request
        if request is not None
        else json.dumps({"scorers": list(scorers), "prompts": list(prompts), "request_id": "r1"})
    )
    return client.post("/v1/score", data={"request": header}, files=files, headers=headers)


def test_scores_match_the_scorers_and_png_equals_safetensors(client):
    r = _post(client, scorers=("shapes_oracle", "jpeg_compressibility"))
    assert r.status_code == 200, r.text
    body = ScoreResponse.model_validate(r.json())
    assert body.request_id == "r1" and body.cached == {
        "shapes_oracle": 0,
        "jpeg_compressibility": 0,
    }
    assert body.scores["shapes_oracle"] == pytest.approx(ShapesOracle().score(IMAGES, PROMPTS))
    assert body.scores["jpeg_compressibility"] == pytest.approx(
        JpegCompressibility().score(IMAGES, PROMPTS)
    )
    pngs = [("images", (f"{i}.png", encode_png(img), "image/png")) for i, img in enumerate(IMAGES)]
    r2 = _post(client, raw=pngs, scorers=("jpeg_compressibility",))
    assert r2.json()["scores"] == {"jpeg_compressibility": body.scores["jpeg_compressibility"]}
    assert r2.json()["cached"]["jpeg_compressibility"] == 6  # same pixels, same prompts


def test_retry_is_a_cache_hit_and_metrics_count_it(client):
    first = _post(client).json()
    again = _post(client).json()
    assert again["scores"] == first["scores"] and again["cached"]["shapes_oracle"] == 6
    m = client.get("/metrics")
    assert m.status_code == 200 and not m.history  # no redirect
    text = m.text
    assert 'g2rpo_reward_requests_total{status="200"} 2.0' in text
    assert 'g2rpo_reward_cache_hits_total{scorer="shapes_oracle"} 6.0' in text
    assert 'g2rpo_reward_images_scored_total{scorer="shapes_oracle"} 6.0' in text
    assert "g2rpo_reward_batch_size_bucket" in text and "g2rpo_reward_queue_depth" in text


@pytest.mark.parametrize(
    ("kwargs", "status", "field"),
    [
        (dict(scorers=("hps",)), 422, "scorers"),
        (dict(prompts=PROMPTS[:2]), 422, "prompts"),
        (
            dict(
                raw={
                    "images": (
                        "b.safetensors",
                        save({"images": IMAGES[..., :2].copy()}),
                        SAFETENSORS_TYPE,
                    )
                }
            ),
            422,
            "images",
        ),
        (dict(request="{not json"), 422, "request"),  # the whole JSON part
        (dict(request='{"scorers": [], "prompts": []}'), 422, "request.scorers"),
        (dict(raw={"images": ("b.safetensors", b"garbage", SAFETENSORS_TYPE)}), 422, "images"),
        (dict(raw={"images": ("x.png", b"\x89PNG broken", "image/png")}), 422, "images"),
        (dict(images=np.zeros((2, 65, 65, 3), np.uint8), prompts=["a", "b"]), 413, "images"),
        (dict(images=np.zeros((17, 8, 8, 3), np.uint8), prompts=["a"] * 17), 413, "images"),
    ],
)
def test_bad_requests_name_the_field(client, kwargs, status, field):
    r = _post(client, **kwargs)
    assert r.status_code == status, r.text
    assert r.json()["field"] == field and r.json()["detail"].startswith(field)


def test_float_safetensors_is_rejected_with_the_dtype(client):
    raw = {
        "images": ("b.safetensors", save({"images": IMAGES.astype(np.float32)}), SAFETENSORS_TYPE)
    }
    r = _post(client, raw=raw)
    assert r.status_code == 422 and "uint8" in r.json()["detail"]


def test_missing_parts_are_422(client):
    r = client.post("/v1/score", data={"request": "{}"})
    assert r.status_code == 422
    assert client.post("/v1/score").status_code == 422


def test_payload_limit_is_413():
    with TestClient(create_app(_settings(max_payload_bytes=4096))) as c:
        big = np.zeros((8, 64, 64, 3), np.uint8)
        r = _post(c, images=big, prompts=["p"] * 8)
        assert r.status_code == 413 and r.json()["field"] == "body"
        assert 'g2rpo_reward_requests_total{status="413"} 1.0' in c.get("/metrics").text


def test_token_is_enforced_on_v1_only():
    with TestClient(create_app(_settings(token=SECRET))) as c:
        assert _post(c).status_code == 401
        assert _post(c, headers={"Authorization": "Bearer nope"}).status_code == 401
        assert _post(c, headers={"Authorization": f"Bearer {SECRET}"}).status_code == 200
        assert c.get("/v1/scorers").status_code == 401
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200
        counted = c.get("/metrics").text  # refusals of /v1/score are counted too
        assert 'g2rpo_reward_requests_total{status="401"} 2.0' in counted
        assert 'g2rpo_reward_requests_total{status="200"} 1.0' in counted


def test_scorers_and_health(client):
    listed = client.get("/v1/scorers").json()["scorers"]
    assert {s["name"] for s in listed} == {"shapes_oracle", "jpeg_compressibility"}
    assert client.get("/healthz").json()["status"] == "alive"
    assert client.get("/readyz").json()["status"] == "ready"


class _RecordingScorer:
    name, version = "slow", "1"

    def __init__(self):
        self.batches = []

    def score(self, images, prompts):
        self.batches.append(len(prompts))
        time.sleep(0.05)
        return np.arange(len(prompts), dtype=np.float32) + float(images[:, 0, 0, 0].sum())


def test_concurrent_requests_are_batched():
    import asyncio

    import httpx

    scorer = _RecordingScorer()
    settings = ServerSettings(scorers=[ScorerSpec(name="slow")], max_batch=64, max_wait_ms=30)
    app = create_app(settings, scorers={"slow": scorer})

    async def main():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:

                async def one(i):
                    img = np.full((2, 4, 4, 3), i, np.uint8)
                    files = {"images": ("b.safetensors", encode_safetensors(img), SAFETENSORS_TYPE)}
                    header = f'{{"scorers": ["slow"], "prompts": ["p{i}", "q{i}"]}}'
                    r = await c.post("/v1/score", data={"request": header}, files=files)
                    return r.json()["scores"]["slow"]

                return await asyncio.gather(*(one(i) for i in range(12)))

    results = asyncio.run(main())
    assert sum(scorer.batches) == 24 and len(scorer.batches) < 12  # merged
    assert max(scorer.batches) > 2
    assert all(len(r) == 2 for r in results)


def test_public_bind_needs_a_token():
    with pytest.raises(ValueError, match="--insecure"):
        _settings(host="0.0.0.0").check_bind()
    _settings(host="0.0.0.0", token=SECRET).check_bind()
    _settings(host="0.0.0.0", insecure=True).check_bind()
    _settings(host="::1").check_bind()


def test_png_of_another_format_is_refused(client):
    buf = io.BytesIO()
    Image.fromarray(IMAGES[0]).save(buf, format="JPEG")
    r = _post(
        client, raw=[("images", ("a.jpg", buf.getvalue(), "image/jpeg"))], prompts=PROMPTS[:1]
    )
    assert r.status_code == 422 and "PNG" in r.json()["detail"]


def test_scorer_device_is_checked_at_start():
    import torch

    _settings(device="cpu").check_device()
    with pytest.raises(ValueError, match="--device 'tpu'"):
        _settings(device="tpu").check_device()
    if not torch.cuda.is_available():  # CI: no GPU, so asking for one fails at start
        with pytest.raises(ValueError, match="no CUDA device"):
            _settings(device="cuda").check_device()
    else:
        _settings(device="cuda").check_device()


# --- decoding off the event loop --------------------------------------------------------


class _FirstPixel:
    """A scorer that costs nothing, so a request's time is its decoding."""

    name, version = "first_pixel", "1"

    def score(self, images, prompts):
        return images[:, 0, 0, 0].astype(np.float32)


def test_decoding_does_not_block_the_event_loop():
    """/healthz is asked again and again while a batch of large PNGs is decoded. A
    decoder on the event loop stops every other request for as long as it runs, so the
    longest wait between two health answers would be at least the decode time; the
    control below shows this measurement sees exactly that. Off the loop, health answers
    keep coming while the server decodes: the longest wait is shorter than the decoding."""
    import httpx

    ramp = np.arange(1024, dtype=np.uint8)[None, :, None] * np.ones((1024, 1, 3), np.uint8)
    png = encode_png(ramp)  # 1024 px: a few ms to decode each, a few KB to send
    n = 24
    settings = ServerSettings(scorers=[ScorerSpec(name="first_pixel")], max_batch=n)
    app = create_app(settings, scorers={"first_pixel": _FirstPixel()})

    async def longest_health_wait(client, work) -> tuple[float, object]:
        """Run ``work`` while /healthz is asked in a loop; the longest time between two
        consecutive health answers, from one answer before ``work`` to one after it."""
        answers: list[float] = []
        stop = asyncio.Event()

        async def ping():
            while not stop.is_set():
                r = await client.get("/healthz")
                assert r.status_code == 200
                answers.append(time.perf_counter())
                await asyncio.sleep(0)  # an in-process answer may never suspend: let others run

        pinger = asyncio.create_task(ping())
        while not answers:
            await asyncio.sleep(0)
        result = await work()
        seen = len(answers)
        while len(answers) == seen:
            await asyncio.sleep(0)
        stop.set()
        await pinger
        return float(np.diff(answers).max()), result

    async def main():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:

                async def blocking_decode():  # the control: decoding on the loop
                    start = time.perf_counter()
                    decode_pngs([png] * n, settings.max_side)
                    return time.perf_counter() - start

                async def score():
                    files = [("images", (f"{i}.png", png, "image/png")) for i in range(n)]
                    header = json.dumps({"scorers": ["first_pixel"], "prompts": ["p"] * n})
                    r = await c.post("/v1/score", data={"request": header}, files=files)
                    assert r.status_code == 200, r.text
                    return r.json()["timings_ms"]["decode"] / 1000

                control = await longest_health_wait(c, blocking_decode)
                served = await longest_health_wait(c, score)
                return control, served

    (control_wait, control_decode), (wait, decode) = asyncio.run(main())
    assert control_wait >= control_decode  # the measurement sees a blocked loop
    assert wait < decode, f"health waited {wait:.3f} s while decoding took {decode:.3f} s"
