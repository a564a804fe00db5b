"""Plain HTTP scoring beside Gradio's queue: ``POST /v1/score`` with two files, one JSON answer.

The Gradio endpoints (``/score`` through ``gradio_client``) take four requests per pair (two uploads, a
queue join, an event stream) and the client polls its stream every 50 ms; this route takes one request
and answers as soon as the score is ready. Same service call, same answer as ``/score``::

    curl -F image_a=@a.jpg -F image_b=@b.jpg http://127.0.0.1:7860/v1/score
    # {"similarity": 0.83, "distance": 0.58, "same": true, "threshold": 0.71, "model_version": "v3"}

With ``SIAMESE_AUTH`` set it asks for the same users' HTTP Basic credentials (``curl -u user:password``).
A bad request answers 400 (401 without credentials, 413 when too large) with ``{"error": message}``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Sequence

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .images import MAX_BYTES

SCORE_PATH = "/v1/score"
FIELDS = ("image_a", "image_b")
MAX_BODY = 2 * MAX_BYTES + 64 * 1024  # two images at the upload limit, and the multipart framing
TOO_LARGE = f"the request is larger than {MAX_BODY:,} bytes (two images of at most {MAX_BYTES:,})"
MAX_MESSAGE = 300  # characters of a service message echoed back


def score_route(service, users: Sequence[tuple[str, str]] = ()) -> Route:
    """The ``/v1/score`` route over ``service.score``; ``users`` (``Settings.auth``) may use it when given."""
    users = tuple(users)

    async def score(request: Request) -> JSONResponse:
        if users and not _authorized(request.headers.get("authorization", ""), users):
            return _error(
                "log in first: send HTTP Basic credentials of a SIAMESE_AUTH user (curl -u user:password)",
                401,
                {"WWW-Authenticate": 'Basic realm="siamese"'},
            )
        try:
            image_a, image_b = await _two_images(request)
        except _BadRequest as error:
            return _error(error.message, error.status)
        try:  # off the event loop: Gradio's queue runs on it
            return JSONResponse(await run_in_threadpool(service.score, image_a, image_b))
        except (ValueError, LookupError, RuntimeError) as error:
            return _error(str(error)[:MAX_MESSAGE] or type(error).__name__, 400)

    return Route(SCORE_PATH, score, methods=["POST"])


class _BadRequest(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message, self.status = message, status


def _error(message: str, status: int, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _authorized(header: str, users: tuple[tuple[str, str], ...]) -> bool:
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        user, _, password = base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return False
    found = False
    for known_user, known_password in users:  # every pair compared, in constant time each
        same_user = hmac.compare_digest(user.encode(), known_user.encode())
        found |= same_user & hmac.compare_digest(password.encode(), known_password.encode())
    return found


async def _two_images(request: Request) -> tuple[bytes, bytes]:
    """The bytes of the ``image_a`` and ``image_b`` files of a multipart body of at most MAX_BODY bytes."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise _BadRequest(
            "send a multipart/form-data body with two files, image_a and image_b (curl -F image_a=@a.jpg)"
        )
    declared = request.headers.get("content-length")
    if declared is not None and not declared.isdigit():
        raise _BadRequest(f"Content-Length must be a number of bytes, got {declared[:40]!r}")
    if declared is not None and int(declared) > MAX_BODY:
        raise _BadRequest(TOO_LARGE, 413)
    body, size = [], 0
    async for chunk in request.stream():  # read with a cap: a body without a length may not end
        size += len(chunk)
        if size > MAX_BODY:
            raise _BadRequest(TOO_LARGE, 413)
        body.append(chunk)
    data = b"".join(body)

    async def replay() -> dict:
        return {"type": "http.request", "body": data, "more_body": False}

    try:
        form = await Request(request.scope, replay).form(max_files=len(FIELDS), max_fields=len(FIELDS))
    except HTTPException as error:  # Starlette's multipart errors (too many parts, a broken body)
        raise _BadRequest(f"could not read the multipart body: {error.detail}") from None
    try:
        found = []
        for name in FIELDS:
            part = form.get(name)
            if part is None or isinstance(part, str):
                raise _BadRequest(f"missing file {name!r}: send both image_a and image_b as files")
            found.append(await part.read())
        return found[0], found[1]
    finally:
        await form.close()
