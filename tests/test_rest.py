"""``POST /v1/score`` on the real ``python app.py``: the same answer as ``/score``, bad requests, login."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import urllib.error
import urllib.request
import uuid

import pytest
from starlette.requests import Request

from siamese.images import MAX_BYTES
from siamese.rest import MAX_BODY, SCORE_PATH, _BadRequest, _two_images
from tests.appserver import run_app, shape_png

gradio_client = pytest.importorskip("gradio_client")


def multipart(files: dict[str, bytes], fields: dict[str, str] | None = None) -> tuple[bytes, str]:
    """A multipart/form-data body built by hand (so the test does not share the server's parser)."""
    boundary = uuid.uuid4().hex
    parts = []
    for name, value in (fields or {}).items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    for name, data in files.items():
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{name}.png"\r\n'
        parts.append(head.encode() + b"Content-Type: application/octet-stream\r\n\r\n" + data + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def post(url: str, body: bytes, content_type: str, auth: tuple[str, str] | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url + SCORE_PATH, data=body, method="POST")
    request.add_header("Content-Type", content_type)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def score(url: str, a: bytes, b: bytes, auth=None) -> tuple[int, dict]:
    return post(url, *multipart({"image_a": a, "image_b": b}), auth=auth)


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with run_app(tmp_path_factory.mktemp("rest") / "data") as server:
        yield server


@pytest.mark.slow
def test_the_same_answer_as_the_gradio_endpoint(app, tmp_path):
    a, b = shape_png("circle", 1), shape_png("square", 2)
    status, answer = score(app.url, a, b)
    assert status == 200
    paths = []
    for name, data in (("a.png", a), ("b.png", b)):
        (tmp_path / name).write_bytes(data)
        paths.append(gradio_client.handle_file(str(tmp_path / name)))
    expected = gradio_client.Client(app.url, verbose=False).predict(*paths, api_name="/score")
    assert answer.keys() == expected.keys()
    assert answer["similarity"] == pytest.approx(expected["similarity"], abs=1e-6)
    assert answer["distance"] == pytest.approx(expected["distance"], abs=1e-6)
    assert (answer["same"], answer["threshold"], answer["model_version"]) == (
        expected["same"],
        expected["threshold"],
        expected["model_version"],
    )
    # the distance of unit vectors follows from their cosine: an independent check of the numbers
    assert answer["distance"] == pytest.approx((2 - 2 * answer["similarity"]) ** 0.5, abs=1e-4)
    swapped = score(app.url, b, a)[1]
    assert swapped["similarity"] == pytest.approx(answer["similarity"], abs=1e-6)


@pytest.mark.slow
def test_bad_requests_say_what_was_wrong_and_the_server_keeps_serving(app):
    good = shape_png("triangle", 3)
    cases = [
        (multipart({"image_a": good, "image_b": b"not an image at all"}), 400, "image"),
        (multipart({"image_a": good}), 400, "missing file 'image_b'"),
        (multipart({"image_a": good, "picture": good, "image_b": good}), 400, "multipart"),  # three files
        (multipart({"image_a": good}, {"image_b": "a string, not a file"}), 400, "missing file 'image_b'"),
        ((b'{"image_a": 1}', "application/json"), 400, "multipart/form-data"),
        ((b"--x\r\nbroken", "multipart/form-data; boundary=x"), 400, ""),
    ]
    for (body, content_type), status, words in cases:
        got, answer = post(app.url, body, content_type)
        assert got == status, (words, answer)
        assert words.lower() in answer["error"].lower(), answer
    # Over the limit by its declared length: refused before a byte of the body is read.
    host, port = app.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        head = (
            f"POST {SCORE_PATH} HTTP/1.1\r\nHost: {host}\r\nContent-Type: multipart/form-data; boundary=x\r\n"
            f"Content-Length: {MAX_BODY + 1}\r\nConnection: close\r\n\r\n"
        )
        sock.sendall(head.encode())
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    status_line, _, rest = reply.partition(b"\r\n")
    assert b" 413 " in status_line
    assert f"{MAX_BYTES:,}" in json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
    assert score(app.url, shape_png("circle", 9), shape_png("circle", 10))[0] == 200


def test_a_body_without_a_length_is_read_only_up_to_the_limit():
    """Chunked uploads declare no length: reading stops at MAX_BODY, whatever the sender keeps sending."""
    sent = 0

    async def receive() -> dict:
        nonlocal sent
        sent += 1 << 20
        return {"type": "http.request", "body": b"\0" * (1 << 20), "more_body": True}  # never ends

    scope = {"type": "http", "method": "POST", "headers": [(b"content-type", b"multipart/form-data; boundary=x")]}
    with pytest.raises(_BadRequest) as refused:
        asyncio.run(_two_images(Request(scope, receive)))
    assert refused.value.status == 413
    assert MAX_BODY < sent <= MAX_BODY + (1 << 20)  # one chunk past the limit, not one more


@pytest.mark.slow
def test_with_login_only_known_users_score(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("rest-auth") / "data"
    with run_app(data_dir, env={"SIAMESE_AUTH": "ann:s3cret,bob:pw:with:colons"}) as guarded:
        a, b = shape_png("circle", 4), shape_png("square", 5)
        for auth in (None, ("ann", "wrong"), ("eve", "s3cret"), ("ann", "s3cret:")):
            status, answer = score(guarded.url, a, b, auth=auth)
            assert status == 401 and "log in" in answer["error"], auth
        for auth in (("ann", "s3cret"), ("bob", "pw:with:colons")):
            status, answer = score(guarded.url, a, b, auth=auth)
            assert status == 200 and -1 <= answer["similarity"] <= 1, auth
