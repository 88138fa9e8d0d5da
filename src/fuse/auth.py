"""Bearer-token checks shared by the agent and the controller."""

from __future__ import annotations

import hmac

from fastapi import Request

from .errors import Unauthorized


def bearer_checker(token: str | None):
    """A FastAPI dependency: requests over the owner-only socket pass (the
    file mode authenticated them); others need `Authorization: Bearer
    <token>`, compared in constant time. With no token configured, TCP is
    open (loopback development only; the CLI warns)."""
    expected = (token or "").encode()

    async def check(request: Request) -> None:
        if request.scope.get("fuse_trusted") or not expected:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise Unauthorized("missing or wrong bearer token")

    return check


class BearerFirst:
    """ASGI middleware: the same check as ``bearer_checker``, before anything reads the
    request, so a caller without the token learns nothing but 401 (a route's body is
    parsed before its dependencies run: a malformed one answered 400 first). ``open``:
    paths that need no token."""

    def __init__(self, app, token: str | None, open: tuple[str, ...] = ()):
        self.app, self.expected, self.open = app, (token or "").encode(), frozenset(open)

    async def __call__(self, scope, receive, send):
        if (scope["type"] == "http" and self.expected and not scope.get("fuse_trusted")
                and scope["path"] not in self.open and not self._allowed(scope)):
            from starlette.responses import JSONResponse
            resp = JSONResponse(Unauthorized("missing or wrong bearer token").body(), status_code=401)
            await resp(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope) -> bool:
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
        scheme, _, given = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.expected)

