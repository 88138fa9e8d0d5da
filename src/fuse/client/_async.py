from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any, cast

import httpx

from . import _core
from ._core import Call
from .hosts import HostsAPI

if TYPE_CHECKING:  # (the resources' async faces, for type checkers: at run time they are the sync classes)
    from ._typing import (AsyncControllerAPI, AsyncEventsAPI, AsyncHealth, AsyncHostsAPI, AsyncMovesAPI,
                          AsyncPoolAPI, AsyncUsage, AsyncVmsAPI)


class AsyncClient:
    """The asynchronous fuse client: the same resources as `Client`, whose
    methods return awaitables. Use as `async with fuse.AsyncClient(...) as c`.

    Its connections belong to the event loop and process they were opened in: a
    call in another loop (a second `asyncio.run()`) or after `os.fork()` opens
    new ones, leaving the old unclosed. After `aclose()` every call is a `ValueError`."""

    # (declared here for type checkers: `_resources.attach` sets all but hosts when the client is made)
    hosts: AsyncHostsAPI
    vms: AsyncVmsAPI
    moves: AsyncMovesAPI
    events: AsyncEventsAPI
    pool: AsyncPoolAPI
    controller: AsyncControllerAPI
    usage: AsyncUsage
    health: AsyncHealth

    def __init__(self, url: str | None = None, token: str | None = None, *,
                 timeout: _core.TimeoutArg = _core.DEFAULT_TIMEOUT,
                 transport: httpx.AsyncBaseTransport | None = None):
        base, uds = _core.resolve_url(url)
        self._where = _core.where(base, uds)
        self._timeout = _core.check_timeout(timeout)
        self._base, self._uds, self._headers, self._given = base, uds, _core.headers(token), transport
        self._proxy = None if transport is not None else _core.proxy_for(base, uds)
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None  # (the loop its connections belong to, once used)
        self._http = self._new_http()
        self.hosts = cast("AsyncHostsAPI", HostsAPI(self._send))
        from . import _resources
        _resources.attach(self, asynchronous=True)

    def _new_http(self) -> httpx.AsyncClient:
        """An httpx client with a pool of its own (a given transport is the caller's, and kept)."""
        self._pid, self._loop = os.getpid(), None
        transport = self._given or _core.transport(self._uds, self._proxy, asynchronous=True)
        return httpx.AsyncClient(base_url=self._base, headers=self._headers, timeout=self._timeout,
                                 transport=transport)

    def _client(self) -> httpx.AsyncClient:
        if self._closed:
            raise ValueError(_core.CLOSED)
        loop = _running_loop()
        if self._pid != os.getpid() or self._loop not in (None, loop):
            # Forked (the kept-alive connections are the parent's sockets too: parent and child got
            # each other's answers), or in another event loop than the pool's (a second
            # `asyncio.run()`: "Event loop is closed", review 38): the pool is dropped unclosed
            # (closing would end the parent's connections, or needs the old loop) for a new one.
            self._http = self._new_http()
        self._loop = loop
        return self._http

    async def _send(self, call: Call) -> Any:
        kw = {"timeout": call.timeout} if call.timeout is not None else {}
        _core.check_params(call.params)
        http = self._client()
        try:
            resp = await http.request(call.method, call.path, params=call.params, **_core.body_kw(call.body), **kw)
        except httpx.TransportError as exc:
            if self._closed:  # (closed by another task while this call waited)
                raise ValueError(_core.CLOSED) from None
            raise _core.unreachable(exc, self._where, self._proxy) from exc
        except httpx.DecodingError as exc:  # (an answer whose Content-Encoding its body is not)
            raise _core.undecodable(exc, call) from exc
        except httpx.InvalidURL as exc:  # (a name too long for a URL, say: the request is never made)
            raise _core.unsendable(exc, call) from None
        except RuntimeError:  # (httpx's "the client has been closed": closed between the check and the send)
            if self._closed:
                raise ValueError(_core.CLOSED) from None
            raise
        return _core.finish(call, resp)

    async def aclose(self) -> None:
        """Close the connections; every call after it is a ValueError."""
        self._closed = True
        if self._pid != os.getpid() or self._loop not in (None, _running_loop()):
            return  # (another process's connections, or another loop's: dropped, as `_client` does)
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The asyncio loop this runs in; None under another event loop (trio, through anyio)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
