"""The reward app behind a real uvicorn: every refusal over real HTTP (declared or chunked
bodies, wrong or missing token, bad fields) has the one error shape, and the same request
within the limits is scored (in process: tests/test_reward_app.py)."""

import contextlib
import threading
import time

import numpy as np
import pytest
from g2rpo.reward_server.app import create_app
from g2rpo.reward_server.schemas import SAFETENSORS_TYPE, ErrorResponse
from g2rpo.reward_server.scorers.shapes_oracle import ShapesOracle
from g2rpo.reward_server.wire import encode_safetensors
from reward_app_inputs import IMAGES, PROMPTS, SECRET, _settings
from servers import free_port

# --- one error shape over real HTTP ---------------------------------------------------


@contextlib.contextmanager
def _live(app):
    """The app behind a real uvicorn on a free port (lifespan included)."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


LIMIT = 4096
TOKEN = {"Authorization": f"Bearer {SECRET}"}


@pytest.fixture(scope="module")
def live_url():
    settings = _settings(token=SECRET, max_payload_bytes=LIMIT, max_side=64, max_images=16)
    with _live(create_app(settings)) as url:
        yield url


def _form(request: dict, files: list[tuple[str, bytes, str]]) -> tuple[bytes, str]:
    """A multipart body by hand, to send it with or without a Content-Length."""
    import json

    boundary = "g2rpo-test-boundary"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="request"\r\n\r\n'.encode()
        + json.dumps(request).encode()
        + b"\r\n"
    ]
    for name, data, ctype in files:
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="images"; '
            f'filename="{name}"\r\nContent-Type: {ctype}\r\n\r\n'
        )
        parts.append(head.encode() + data + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


GOOD = {"scorers": ["shapes_oracle"], "prompts": PROMPTS[:1]}
ONE_IMAGE = [("b.safetensors", encode_safetensors(IMAGES[:1]), SAFETENSORS_TYPE)]
BIG = [("b.safetensors", encode_safetensors(np.zeros((1, 40, 40, 3), np.uint8)), SAFETENSORS_TYPE)]


def _chunks(body: bytes, size: int = 1024):
    for lo in range(0, len(body), size):
        yield body[lo : lo + size]


@pytest.mark.parametrize(
    ("request_json", "files", "headers", "chunked", "status", "field"),
    [
        pytest.param(GOOD, [], TOKEN, False, 422, "images", id="no-images"),
        pytest.param(GOOD, ONE_IMAGE, {"Authorization": "Bearer nope"}, False, 401,
                     "authorization", id="wrong-token"),
        pytest.param(GOOD, ONE_IMAGE, {}, False, 401, "authorization", id="no-token"),
        pytest.param(GOOD, BIG, TOKEN, False, 413, "body", id="declared-length-too-large"),
        pytest.param(GOOD, BIG, TOKEN, True, 413, "body", id="chunked-body-too-large"),
        pytest.param({**GOOD, "prompts": "one"}, ONE_IMAGE, TOKEN, False, 422,
                     "request.prompts", id="bad-field"),
        pytest.param({**GOOD, "extra": 1}, ONE_IMAGE, TOKEN, True, 422, "request.extra",
                     id="unknown-field-chunked"),
    ],
)  # fmt: skip
def test_every_refusal_has_the_one_error_shape(
    live_url, request_json, files, headers, chunked, status, field
):
    import httpx

    body, ctype = _form(request_json, files)
    assert (len(body) > LIMIT) == (status == 413)
    content = _chunks(body) if chunked else body
    r = httpx.post(
        f"{live_url}/v1/score",
        content=content,
        headers={**headers, "Content-Type": ctype},
        timeout=30,
    )
    sent = r.request.headers
    assert ("content-length" in sent) != chunked and (
        sent.get("transfer-encoding") == "chunked"
    ) == chunked
    assert r.status_code == status, r.text
    error = ErrorResponse.model_validate(r.json())  # exactly {"detail", "field"}
    assert error.field == field and error.detail
    if status == 401:
        assert r.headers["WWW-Authenticate"] == "Bearer"


def test_the_same_request_within_limits_is_scored(live_url):
    import httpx

    body, ctype = _form(GOOD, ONE_IMAGE)
    r = httpx.post(
        f"{live_url}/v1/score", content=_chunks(body), headers={**TOKEN, "Content-Type": ctype}
    )
    assert r.status_code == 200, r.text
    assert r.json()["scores"]["shapes_oracle"] == pytest.approx(
        ShapesOracle().score(IMAGES[:1], PROMPTS[:1])
    )
