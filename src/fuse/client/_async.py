from __future__ import annotations

from typing import Any

import httpx

from . import _core
from ._core import Call
from .hosts import HostsAPI


class AsyncClient:
    """The asynchronous fuse client: the same resources as `Client`, whose
    methods return awaitables. Use as `async with fuse.AsyncClient(...) as c`."""

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = _core.DEFAULT_TIMEOUT,
                 transport: httpx.AsyncBaseTransport | None = None):
        base, uds = _core.resolve_url(url)
        self._where = _core.where(base, uds)
        self._timeout = timeout = _core.check_timeout(timeout)
        if transport is None and uds:
            transport = httpx.AsyncHTTPTransport(uds=uds, limits=_core.LIMITS)
        self._http = httpx.AsyncClient(base_url=base, headers=_core.headers(token), timeout=timeout,
                                       transport=transport, limits=_core.LIMITS)
        self.hosts = HostsAPI(self._send)
        from . import _resources
        _resources.attach(self, asynchronous=True)

    async def _send(self, call: Call) -> Any:
        kw = {"timeout": call.timeout} if call.timeout is not None else {}
        _core.check_params(call.params)
        try:
            resp = await self._http.request(call.method, call.path, params=call.params,
                                            **_core.body_kw(call.body), **kw)
        except httpx.TransportError as exc:
            raise _core.unreachable(exc, self._where) from exc
        except httpx.DecodingError as exc:  # (an answer whose Content-Encoding its body is not)
            raise _core.undecodable(exc, call) from exc
        except httpx.InvalidURL as exc:  # (a name too long for a URL, say: the request is never made)
            raise _core.unsendable(exc, call) from None
        return _core.finish(call, resp)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
