from __future__ import annotations

from typing import Any

import httpx

from . import _core
from ._core import Call
from .hosts import HostsAPI


class Client:
    """The synchronous fuse client. `url`: `unix:///path/to.sock` or
    `http(s)://host:port`; default $FUSE_URL, else the controller's socket."""

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = _core.DEFAULT_TIMEOUT,
                 transport: httpx.BaseTransport | None = None):
        base, uds = _core.resolve_url(url)
        self._where = _core.where(base, uds)
        self._timeout = timeout = _core.check_timeout(timeout)
        if transport is None and uds:
            transport = httpx.HTTPTransport(uds=uds, limits=_core.LIMITS)
        self._http = httpx.Client(base_url=base, headers=_core.headers(token), timeout=timeout, transport=transport,
                                  limits=_core.LIMITS)
        self.hosts = HostsAPI(self._send)
        _attach_optional(self)

    def _send(self, call: Call) -> Any:
        kw = {"timeout": call.timeout} if call.timeout is not None else {}
        _core.check_params(call.params)
        try:
            resp = self._http.request(call.method, call.path, params=call.params, **_core.body_kw(call.body),
                                      **kw)
        except httpx.TransportError as exc:
            raise _core.unreachable(exc, self._where) from exc
        except httpx.DecodingError as exc:  # (an answer whose Content-Encoding its body is not)
            raise _core.undecodable(exc, call) from exc
        except httpx.InvalidURL as exc:  # (a name too long for a URL, say: the request is never made)
            raise _core.unsendable(exc, call) from None
        return _core.finish(call, resp)

    def close(self) -> None:
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
