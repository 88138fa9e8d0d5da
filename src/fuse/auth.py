"""The bearer-token check shared by the agent and the controller."""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse

from .errors import Unauthorized


class BearerFirst:
    """ASGI middleware, before anything reads the request (so a caller without the
    token learns nothing but 401, whatever body it sent): requests over the
    owner-only socket pass (the file mode authenticated them); others need
    `Authorization: Bearer <token>`, compared in constant time. With no token
    configured, TCP is open (loopback development only; the CLI warns). ``open``:
    paths that need no token."""

    def __init__(self, app, token: str | None, open: tuple[str, ...] = ()):
        self.app, self.expected, self.open = app, (token or "").encode(), frozenset(open)

    async def __call__(self, scope, receive, send):
        if (scope["type"] == "http" and self.expected and not scope.get("fuse_trusted")
                and scope["path"] not in self.open and not self._allowed(scope)):
            resp = JSONResponse(Unauthorized("missing or wrong bearer token").body(), status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})  # (RFC 9110: a 401 names its scheme)
            await resp(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope) -> bool:
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
        scheme, _, given = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.expected)
