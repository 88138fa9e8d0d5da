"""One seam through which the controller reaches every host's public API.

An address names its transport:

    local                  this machine's agent socket (owner-only)
    unix:///path/to.sock   an agent socket at a given path
    http(s)://host:port    TCP with the agent's bearer token
    ssh://user@host[:port] SSH with keys; `fuse host relay` on the far side
    host:port              the agent's mutual-TLS listener

An address is parsed once, by `address.parse_address`, before anything is
stored or dialled: one that cannot be an address (a port out of range, an IP
literal that is not one, no host) is `BadAddress`, 400 `invalid_argument`.

Whatever the transport, callers get a `HostConnection` whose `request` speaks
the same host API and turns every way of not getting there into
`HostUnreachable` with a one-sentence reason; failed trust (a TLS certificate
that does not verify, an https:// host's included, or the host refusing the
controller's) is its subclass `NotTrusted`, which registration never goes
around. An idempotent read may ask for `retries`: an agent closes a kept-alive
connection after ~5 s idle, and a request that meets one as it closes is sent
again on a new one.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Any

import httpx

from ..errors import HostUnreachable, NotTrusted
from ..paths import default_agent_socket
from .address import Address, BadAddress, normalise_address, on_this_machine, parse_address, transport_kind

__all__ = ["Address", "BadAddress", "HostConnection", "TlsSettings", "default_agent_socket", "normalise_address",
           "on_this_machine", "parse_address", "transport_kind"]


@dataclass(frozen=True)
class TlsSettings:
    """The controller's client identity for mutual-TLS hosts."""
    cert: str
    key: str
    ca: str

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        ctx.load_cert_chain(self.cert, self.key)
        # a host's certificate must name the address it is dialled at (its IP or DNS name:
        # `fuse host cert issue --name`): any certificate the CA signed let one host stand in for another
        ctx.check_hostname = True
        return ctx


RETRY_BACKOFF_S = 0.2  # the first pause before a retry; each next one doubles
IDEMPOTENT = ("GET", "HEAD")

# How a peer hanging up reads, in httpx's words and OpenSSL's.
_HUNG_UP = ("server disconnected without sending", "connection reset", "unexpected eof", "eof occurred",
            "peer closed connection")


def _describe(exc: Exception, address: Address, handshake: bool = False) -> tuple[str, bool]:
    """One sentence saying why a host could not be reached, and whether it was a
    matter of trust (a certificate either side refused: a mistake, not an outage).
    `handshake`: this request made a TLS handshake and got no answer after it."""
    addr = address.text
    # httpx wraps the OS error ("All connection attempts failed"): read the chain.
    chain, cur = [], exc
    while cur is not None and len(chain) < 8:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    if isinstance(exc, httpx.TimeoutException):
        # Before the text checks: a timed-out handshake's chain mentions SSL, and an
        # exception's class name ("ConnectTimeout") is not a reason.
        return _timed_out(exc, addr, address.kind == "tls" and handshake), False
    text = _said(chain)
    low = " ".join(str(c).lower() for c in chain)
    if any(isinstance(c, ConnectionRefusedError) for c in chain):
        low += " connection refused"
    if any(isinstance(c, FileNotFoundError) for c in chain):
        low += " no such file"
    if address.kind == "tls":
        tls, untrusted = _describe_tls(chain, low, addr, handshake)
        if tls:
            return tls, untrusted
    elif why := _verify_failed(chain, low):
        # An https:// host whose certificate does not verify was reached: trust failed,
        # a mistake to fix (as with a mutual-TLS host's), not an outage to register around.
        return (f"TLS with {addr} failed: the host's certificate is not trusted ({why}); it must be signed by a "
                "CA the controller trusts (certifi's bundle, or SSL_CERT_FILE or SSL_CERT_DIR where the controller "
                "runs), unexpired, and name the address's host"), True
    if isinstance(exc, ssl.SSLError) or "certificate" in low or "ssl" in low or "tls" in low:
        return f"TLS with {addr} failed: {text}", False
    if "name or service not known" in low or "nodename nor servname" in low or "temporary failure in name" in low:
        return f"cannot resolve the host name in {addr}: {text}", False
    if "connection refused" in low or "errno 111" in low:
        return f"connection to {addr} was refused: is the host agent running?", False
    if isinstance(exc, (FileNotFoundError,)) or "no such file" in low:
        where = address.path or default_agent_socket()
        return f"no host agent socket at {where}: is the host agent running?", False
    if any(s in low for s in _HUNG_UP):
        return _dropped(addr, chain), False
    return f"cannot reach {addr}: {text}", False


def _describe_tls(chain: list[BaseException], low: str, addr: str, handshake: bool) -> tuple[str | None, bool]:
    """Say which side of a mutual-TLS handshake said no (and that it is a matter of
    trust). Only the handshake can refuse the controller's certificate: a connection
    that answered before and hangs up now was dropped, and says so."""
    if why := _verify_failed(chain, low):
        return (f"TLS with {addr} failed: the host's certificate is not signed by the controller's CA "
                f"or is not valid ({why})"), True
    # The host says no with an alert (bad certificate, unknown ca, certificate
    # required) or, with TLS 1.3, where it checks our certificate after the
    # handshake, by hanging up before it answers the request that shook hands.
    hung_up = any(s in low for s in _HUNG_UP)
    if ("alert" in low and "close notify" not in low) or (handshake and hung_up):
        return (f"TLS with {addr} failed: the host refused the controller's certificate (it must be signed "
                "by the host's CA, unexpired, and issued with --client)"), True
    if hung_up:
        return _dropped(addr, chain), False
    return None, False


def _verify_failed(chain: list[BaseException], low: str) -> str:
    """OpenSSL's reason the host's certificate did not verify ("self-signed
    certificate", "certificate has expired", a name mismatch), or "" if it did."""
    verify = next((c for c in chain if isinstance(c, ssl.SSLCertVerificationError)), None)
    if verify is None and "certificate verify failed" not in low:
        return ""
    return getattr(verify, "verify_message", "") or "certificate verify failed"


# What an exception that says nothing (httpx's ReadError('')) means, in words.
_UNSAID = ((httpx.ConnectError, "the connection could not be opened"),
           (httpx.ReadError, "the connection broke while waiting for the answer"),
           (httpx.WriteError, "the connection broke while sending the request"),
           (httpx.RemoteProtocolError, "the host's answer was not valid HTTP"),
           (httpx.ProxyError, "the proxy refused the connection"),
           (ssl.SSLError, "the TLS layer failed"),
           (OSError, "the network layer failed"))


def _said(chain: list[BaseException]) -> str:
    """The first thing the exception chain says; never a bare class name."""
    said = next((str(c) for c in chain if str(c)), "")
    if said:
        return said
    return next((words for kind, words in _UNSAID if isinstance(chain[0], kind)),
                "the connection failed without saying why")


def _timed_out(exc: httpx.TimeoutException, addr: str, handshake: bool) -> str:
    """Which step ran out of time, and the time it really had."""
    timeouts: dict = {}
    try:
        timeouts = exc.request.extensions.get("timeout") or {}
    except RuntimeError:  # an exception raised without its request
        pass
    step, what = {httpx.ConnectTimeout: ("connect", "accept the connection"),
                  httpx.ReadTimeout: ("read", "answer"),
                  httpx.WriteTimeout: ("write", "take the request"),
                  httpx.PoolTimeout: ("pool", "free a connection")}.get(type(exc), ("read", "answer"))
    if handshake and step == "connect":
        what = "complete the TLS handshake"
    if isinstance(exc, httpx.PoolTimeout):
        limit = timeouts.get("pool")
        return (f"no connection to {addr} came free within {limit:g} s" if limit else
                f"no connection to {addr} came free in time")
    limit = timeouts.get(step)
    if step == "read":
        return f"{addr} did not answer in time" + (f": nothing came back within {limit:g} s" if limit else "")
    return f"{addr} did not {what} within {limit:g} s" if limit else f"{addr} did not {what} in time"


def _dropped(addr: str, chain: list[BaseException]) -> str:
    said = next((str(c) for c in chain if str(c)), "")  # httpx's ReadError('') says nothing
    return f"the connection to {addr} was dropped before the host answered" + (f" ({said})" if said else "")


def _never_sent(exc: BaseException) -> bool:
    """The connection failed before a byte of the request went: not opened (refused, no
    socket, no route, a failed handshake) or no connection free in the pool."""
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
        return True
    cur: BaseException | None = exc
    while cur is not None:
        if isinstance(cur, (ConnectionRefusedError, FileNotFoundError)):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


class HostConnection:
    """A connection to one host's API over the transport its address names."""

    def __init__(self, addr: str, token: str | None = None, tls: TlsSettings | None = None,
                 timeout: float = 10.0):
        self.addr = addr
        self.address = parse_address(addr)  # BadAddress (400) before anything is dialled
        self.kind = self.address.kind
        self.token = token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._ssh = None
        if self.kind == "local":
            path = self.address.path or str(default_agent_socket())
            self._client = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=path),
                                             base_url="http://agent", headers=headers, timeout=timeout)
        elif self.kind == "http":
            self._client = httpx.AsyncClient(base_url=addr, headers=headers, timeout=timeout)
        elif self.kind == "tls":
            if tls is None:
                err = NotTrusted(f"{addr} is a mutual-TLS address but the controller has no "
                                 "certificate: PUT /v1/controller with cert, key and ca first")
                err.maybe_sent = False  # (nothing went out: a create may try another host)
                raise err
            self._client = httpx.AsyncClient(base_url=f"https://{addr}", verify=tls.context(),
                                             headers=headers, timeout=timeout)
        else:
            from .ssh import SshTransport  # imported only where used: asyncssh is heavy
            self._ssh = SshTransport(addr)
            self._client = httpx.AsyncClient(transport=self._ssh, base_url="http://agent",
                                             headers=headers, timeout=timeout)

    async def request(self, method: str, path: str, *, json: Any = None, params: dict | None = None,
                      content: bytes | None = None, timeout: float | None = None,
                      retries: int = 0) -> httpx.Response:
        """Send one request. `retries` (GET and HEAD only: never a call that
        changes anything) sends it again, after a short doubling pause, when
        the connection failed; a timeout is not retried, so a host that went
        away still fails the call in `timeout`."""
        if retries and method.upper() not in IDEMPOTENT:
            raise ValueError(f"{method} is not idempotent: it is never retried")
        kw: dict[str, Any] = {}
        if timeout is not None:
            kw["timeout"] = timeout
        # Whether this request shook hands and then got no answer: only then
        # can a hang-up be the host refusing our certificate.
        shook: list[str] = []

        async def trace(event: str, info: dict) -> None:
            if event in ("connection.start_tls.started", "http11.receive_response_headers.complete"):
                shook.append(event)

        if self.kind == "tls":
            kw["extensions"] = {"trace": trace}
        attempt = 0
        while True:
            shook.clear()
            try:
                return await self._client.request(method, path, json=json, params=params, content=content, **kw)
            except HostUnreachable:
                raise
            except (httpx.TransportError, OSError, ssl.SSLError) as exc:
                if attempt == retries or isinstance(exc, httpx.TimeoutException):
                    why, untrusted = _describe(exc, self.address, handshake=shook == ["connection.start_tls.started"])
                    err = (NotTrusted if untrusted else HostUnreachable)(why)
                    # whether the host may have got the request: a create it got may still land
                    err.maybe_sent = not _never_sent(exc)
                    raise err from exc
            await asyncio.sleep(RETRY_BACKOFF_S * 2 ** attempt)
            attempt += 1

    async def close(self) -> None:
        await self._client.aclose()
