"""Nothing about the app before login: strips the API description from Gradio's login page.

With ``auth`` set, Gradio 6.31 still embeds ``window.gradio_api_info`` (every endpoint, its
parameters and code samples) in the page it serves to visitors who have not logged in. This ASGI
middleware rewrites that one page: when the embedded config says ``auth_required``, the API
description is replaced by an empty object. Every other response passes through untouched.
"""

from __future__ import annotations

import re

_API_INFO = re.compile(rb"window\.gradio_api_info = .*?;</script>", re.DOTALL)
_LOGIN_PAGE = re.compile(rb'window\.gradio_config = \{"auth_required":\s*true')
_EMPTY = b"window.gradio_api_info = {};</script>"


class LoginPageGuard:
    """Wraps an ASGI app; see the module docstring."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "GET":
            await self.app(scope, receive, send)
            return
        start: dict | None = None
        chunks: list[bytes] = []

        async def buffered_send(message):
            nonlocal start
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                if not headers.get(b"content-type", b"").startswith(b"text/html"):
                    start = None
                    await send(message)
                    return
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(chunks)
            if _LOGIN_PAGE.search(body):
                body = _API_INFO.sub(lambda _: _EMPTY, body, count=1)
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, buffered_send)
