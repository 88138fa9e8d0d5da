"""One seam through which the controller reaches every host's public API.

An address names its transport:

    local                  this machine's agent socket (owner-only)
    unix:///path/to.sock   an agent socket at a given path
    http(s)://host:port    TCP with the agent's bearer token
    ssh://user@host[:port] SSH with keys; `fuse host relay` on the far side
    host:port              the agent's mutual-TLS listener

Whatever the transport, callers get a `HostConnection` whose `request` speaks
the same host API and turns every way of not getting there into
`HostUnreachable` with a one-sentence reason.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from typing import Any

import httpx

from ..errors import HostUnreachable
from ..paths import default_agent_socket  # noqa: F401  (re-exported)


@dataclass(frozen=True)
class TlsSettings:
    """The controller's client identity for mutual-TLS hosts."""
    cert: str
    key: str
    ca: str

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        ctx.load_cert_chain(self.cert, self.key)
        ctx.check_hostname = False  # hosts are named by the operator, pinned by our CA
        return ctx


_HOSTPORT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.\-]+):(\d{1,5})$")


def transport_kind(addr: str) -> str:
    if addr == "local" or addr.startswith("unix://"):
        return "local"
    if addr.startswith(("http://", "https://")):
        return "http"
    if addr.startswith("ssh://"):
        return "ssh"
    if _HOSTPORT.match(addr):
        return "tls"
    raise ValueError(f"address {addr!r} is not local, unix://PATH, http(s)://HOST:PORT, "
                     "ssh://USER@HOST[:PORT] or HOST:PORT")


def _describe(exc: Exception, addr: str) -> str:
    """One sentence saying why a host could not be reached."""
    text = str(exc) or exc.__class__.__name__
    # httpx wraps the OS error ("All connection attempts failed"): read the chain.
    chain, cur = [], exc
    while cur is not None and len(chain) < 8:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    low = " ".join(str(c).lower() for c in chain)
    if any(isinstance(c, ConnectionRefusedError) for c in chain):
        low += " connection refused"
    if any(isinstance(c, FileNotFoundError) for c in chain):
        low += " no such file"
    if _HOSTPORT.match(addr):
        tls = _describe_tls(chain, low, addr)
        if tls:
            return tls
    if isinstance(exc, ssl.SSLError) or "certificate" in low or "ssl" in low or "tls" in low:
        return f"TLS with {addr} failed: {text}"
    if "name or service not known" in low or "nodename nor servname" in low or "temporary failure in name" in low:
        return f"cannot resolve the host name in {addr}: {text}"
    if "connection refused" in low or "errno 111" in low:
        return f"connection to {addr} was refused: is the host agent running?"
    if isinstance(exc, (FileNotFoundError,)) or "no such file" in low:
        return f"no host agent socket at {addr}: is the host agent running?"
    if isinstance(exc, httpx.TimeoutException):
        return f"{addr} did not answer in time"
    return f"cannot reach {addr}: {text}"


def _describe_tls(chain: list[BaseException], low: str, addr: str) -> str | None:
    """Say which side of a mutual-TLS handshake said no."""
    verify = next((c for c in chain if isinstance(c, ssl.SSLCertVerificationError)), None)
    if verify is not None or "certificate verify failed" in low:
        why = getattr(verify, "verify_message", "") or "certificate verify failed"
        return (f"TLS with {addr} failed: the host's certificate is not signed by the controller's CA "
                f"or is not valid ({why})")
    # With TLS 1.3 the host checks our certificate after the handshake and
    # hangs up (at best with an alert): that is how it says no to us.
    if any(s in low for s in ("alert", "server disconnected without sending", "connection reset",
                              "unexpected eof")):
        return (f"TLS with {addr} failed: the host refused the controller's certificate (it must be signed "
                "by the host's CA, unexpired, and issued with --client)")
    return None


class HostConnection:
    """A connection to one host's API over the transport its address names."""

    def __init__(self, addr: str, token: str | None = None, tls: TlsSettings | None = None,
                 timeout: float = 10.0):
        self.addr = addr
        self.kind = transport_kind(addr)
        self.token = token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._ssh = None
        if self.kind == "local":
            path = str(default_agent_socket()) if addr == "local" else addr[len("unix://"):]
            self._client = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=path),
                                             base_url="http://agent", headers=headers, timeout=timeout)
        elif self.kind == "http":
            self._client = httpx.AsyncClient(base_url=addr, headers=headers, timeout=timeout)
        elif self.kind == "tls":
            if tls is None:
                raise HostUnreachable(f"{addr} is a mutual-TLS address but the controller has no "
                                      "certificate: PUT /v1/controller with cert, key and ca first")
            self._client = httpx.AsyncClient(base_url=f"https://{addr}", verify=tls.context(),
                                             headers=headers, timeout=timeout)
        else:
            from .ssh import SshTransport  # imported only where used: asyncssh is heavy
            self._ssh = SshTransport(addr)
            self._client = httpx.AsyncClient(transport=self._ssh, base_url="http://agent",
                                             headers=headers, timeout=timeout)

    async def request(self, method: str, path: str, *, json: Any = None, params: dict | None = None,
                      content: bytes | None = None, timeout: float | None = None) -> httpx.Response:
        kw: dict[str, Any] = {}
        if timeout is not None:
            kw["timeout"] = timeout
        try:
            return await self._client.request(method, path, json=json, params=params, content=content, **kw)
        except HostUnreachable:
            raise
        except (httpx.TransportError, OSError, ssl.SSLError) as exc:
            raise HostUnreachable(_describe(exc, self.addr)) from exc

    async def close(self) -> None:
        await self._client.aclose()
