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
