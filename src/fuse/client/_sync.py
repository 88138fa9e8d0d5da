from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import httpx

from . import _core
from ._core import Call
from .hosts import HostsAPI

if TYPE_CHECKING:  # (the resources beyond hosts load when a client is made: `import fuse` stays light)
    from ._typing import Health, Usage
    from .controller import ControllerAPI
    from .events import EventsAPI
    from .moves import MovesAPI
    from .pool import PoolAPI
    from .vms import VmsAPI


class Client:
    """The synchronous fuse client. `url`: `unix:///path/to.sock` or
    `http(s)://host:port`; default $FUSE_URL, else the controller's socket.

    One client serves many threads. Across `os.fork()` the child's first call
    opens connections of its own (the parent's are left to it). After `close()`
    every call is a `ValueError`, and a call under way on another thread (an
    `events.follow` in its long poll) ends with one."""

    # (declared here for type checkers: `_resources.attach` sets all but hosts when the client is made)
    hosts: HostsAPI
    vms: VmsAPI
    moves: MovesAPI
    events: EventsAPI
    pool: PoolAPI
    controller: ControllerAPI
    usage: Usage
    health: Health

    def __init__(self, url: str | None = None, token: str | None = None, *,
                 timeout: _core.TimeoutArg = _core.DEFAULT_TIMEOUT, transport: httpx.BaseTransport | None = None):
        base, uds = _core.resolve_url(url)
        self._where = _core.where(base, uds)
        self._timeout = _core.check_timeout(timeout)
        self._base, self._uds, self._headers, self._given = base, uds, _core.headers(token), transport
        self._proxy = None if transport is not None else _core.proxy_for(base, uds)
        self._closed = False
        self._http = self._new_http()
        self.hosts = HostsAPI(self._send)
        _attach_optional(self)

    def _new_http(self) -> httpx.Client:
        """An httpx client with a pool of its own (a given transport is the caller's, and kept),
        and the pid it serves: its connections are no other process's to use."""
        self._pid = os.getpid()
        self._transport = self._given or _core.transport(self._uds, self._proxy, asynchronous=False)
        return httpx.Client(base_url=self._base, headers=self._headers, timeout=self._timeout,
                            transport=self._transport)

    def _client(self) -> httpx.Client:
        if self._closed:
            raise ValueError(_core.CLOSED)
        if self._pid != os.getpid():
            # Forked: the pool's kept-alive connections are the parent's sockets too, and parent and
            # child reading one socket got each other's answers (`vms.get("v0")` answered with v1,
            # review 38). The child drops them unclosed (closing would end the parent's) for its own.
            self._http = self._new_http()
        return self._http

    def _send(self, call: Call) -> Any:
        kw = {"timeout": call.timeout} if call.timeout is not None else {}
        _core.check_params(call.params)
        http = self._client()
        try:
            resp = http.request(call.method, call.path, params=call.params, **_core.body_kw(call.body), **kw)
        except httpx.TransportError as exc:
            if self._closed:  # (closed by another thread while this call waited: its socket shut down)
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

    def close(self) -> None:
        """Close the connections; every call after it, and one under way, is a ValueError."""
        self._closed = True
        if self._pid != os.getpid():  # (inherited across a fork: the parent's connections, not ours to close)
            return
        _core.interrupt(self._transport)
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _attach_optional(client: Any) -> None:
    """Resources of later layers (vms, moves, events, usage, pool) attach
    themselves here when present."""
    from . import _resources
    _resources.attach(client)
