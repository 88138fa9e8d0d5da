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
A host is dialled at that address and nowhere else: no transport goes through
a proxy named in the controller's environment (HTTP_PROXY, HTTPS_PROXY,
ALL_PROXY), which would be handed the agents' tokens.

Whatever the transport, callers get a `HostConnection` whose `request` speaks
the same host API and turns every way of not getting there into
`HostUnreachable` with a one-sentence reason; failed trust (a TLS certificate
that does not verify, an https:// host's included, or the host refusing the
controller's) is its subclass `NotTrusted`, which registration never goes
around, and so is a controller certificate, key or CA file that cannot be
read or used (moved away since `PUT /v1/controller`): nothing is dialled, and
the reason names the file. An address answered in another protocol (a TLS
handshake met by plain HTTP or an sshd, which is named as one; with
`diagnose`, an sshd at an http:// address or an HTTP server at an ssh://
one) is `NotAnAgent`: a wrong address, never an outage. A certificate refused by
the handshake a request began is a request the host never got (`maybe_sent`
False); a mutual-TLS host that hangs up right after the handshake, before the
refusal can be read, is asked once more (a read, on a connection of its own)
whether it refuses the controller's certificate, since a host that took it and
died may have got the request. An idempotent read
may ask for `retries`: an agent closes a kept-alive connection after ~5 s
idle, and a request that meets one as it closes is sent again on a new one.
"""

from __future__ import annotations

import asyncio
import datetime
import errno
import functools
import logging
import os
import socket
import ssl
import stat
from dataclasses import dataclass
from typing import Any

import httpx
import idna

from ..errors import HostUnreachable, NotAnAgent, NotTrusted
from ..paths import default_agent_socket
from .address import Address, BadAddress, normalise_address, on_this_machine, parse_address, transport_kind

__all__ = ["MAX_FACTS_BYTES", "Address", "BadAddress", "HostConnection", "IdentityError", "TlsSettings",
           "default_agent_socket", "normalise_address", "on_this_machine", "parse_address", "tls_context",
           "transport_kind"]

log = logging.getLogger("fuse.transport")


class IdentityError(ValueError):
    """A certificate, key or CA file that cannot be read or used; the message,
    one sentence, names the file and why."""


def tls_context(purpose: ssl.Purpose, cert: str, key: str, ca: str,
                names: tuple[str, str, str] = ("certificate", "key", "CA file")) -> ssl.SSLContext:
    """A context presenting `cert` (with `key`) and trusting only `ca` (server side:
    `purpose` CLIENT_AUTH), or IdentityError naming the file at fault as `names` calls
    them. Checked file by file first: OpenSSL's own error for a missing CA file names
    no file at all ("[Errno 2] No such file or directory")."""
    for name, path in zip(names, (cert, key, ca)):
        _regular_file(path, name)
    try:
        ctx = ssl.create_default_context(purpose, cafile=ca)
    except ssl.SSLError as exc:
        raise IdentityError(f"{names[2]} {ca} holds no usable PEM certificate ({_ssl_words(exc)})") from None
    def no_passphrase() -> bytes:  # (without it OpenSSL asks one on the terminal: a server froze there)
        raise IdentityError(f"{names[1]} {key} is encrypted (passphrase-protected): fuse reads keys unattended, "
                            "so give it an unencrypted one (owner-only, as `fuse host cert issue` writes them)")

    try:
        ctx.load_cert_chain(cert, key, password=no_passphrase)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise IdentityError(f"{names[1]} {key} is not the key of {names[0]} {cert}") from None
        raise IdentityError(f"{names[0]} {cert} and {names[1]} {key} do not load as a PEM certificate and its key "
                            f"({_ssl_words(exc)})") from None
    return ctx


def _regular_file(path: str, name: str) -> None:
    """IdentityError naming the file (as ``name``, the caller's word for it) when ``path``
    cannot be read or is not a regular file. Looked at before anything opens it: a FIFO or a device put in a PEM
    file's place blocks whoever opens or reads it, and the controller dials on its event loop,
    so one froze every route, SIGTERM's handling with them (review 34)."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise IdentityError(f"{name} {path} is {_file_kind(mode)}, not a regular file")
        # whether it may be read (its permissions); O_NONBLOCK: one made a FIFO since the look
        # does not block this open either
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError as exc:
        raise IdentityError(f"{name} {path} cannot be read ({exc.strerror or exc})") from None


def _file_kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words ("a directory", "a named pipe (FIFO)")."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


def _ssl_words(exc: ssl.SSLError) -> str:
    """OpenSSL's reason in words ("no certificate or crl found"), not its raw text."""
    return (exc.reason or "").replace("_", " ").lower() or exc.strerror or str(exc)


@dataclass(frozen=True)
class TlsSettings:
    """The controller's client identity for mutual-TLS hosts."""
    cert: str
    key: str
    ca: str

    def stamp(self) -> tuple:
        """What the three files are now (inode, size, modification time; None for one that is
        gone): a connection made with other files in place is made again, so a certificate
        renewed in place is presented from then on, and one moved away fails naming it."""
        out = []
        for path in (self.cert, self.key, self.ca):
            try:
                st = os.stat(path)
                out.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                out.append(None)
        return tuple(out)

    def context(self) -> ssl.SSLContext:
        """IdentityError (one sentence naming the file) when the files cannot be used."""
        ctx = tls_context(ssl.Purpose.SERVER_AUTH, self.cert, self.key, self.ca,
                          names=("the controller's certificate", "the controller's key", "the controller's CA file"))
        # a host's certificate must name the address it is dialled at (its IP or DNS name:
        # `fuse host cert issue --name`): any certificate the CA signed let one host stand in for another
        ctx.check_hostname = True
        return ctx

    def check_dates(self, now: datetime.datetime | None = None) -> None:
        """IdentityError (naming the file and its validity dates) when the controller's
        certificate is not valid `now` (default: this moment): every mutual-TLS host
        would refuse it. For PUT /v1/controller; at a dial, a certificate that has
        expired since is the host's to refuse, and its refusal says so."""
        check_cert_dates(self.cert, "the controller's certificate", "fuse host cert issue --client", now)

    def check_purposes(self) -> None:
        """IdentityError when a file cannot serve its purpose though it loads: the
        certificate is not for a TLS client (its extended key usage names others: a
        host's serverAuth certificate, which every mutual-TLS host would refuse), or the
        CA file holds a certificate that is no CA (a leaf, which signs no host's)."""
        check_cert_purpose(self.cert, "cert", client=True)
        check_ca_file(self.ca, "ca")


def _first_cert(path: str, name: str):
    from cryptography import x509  # imported only where used

    _regular_file(path, name)  # (read at a dial too, when a host refused our certificate)
    try:
        with open(path, "rb") as f:
            return x509.load_pem_x509_certificates(f.read())[0]  # the first is ours; a chain may follow
    except (OSError, ValueError) as exc:
        raise IdentityError(f"{name} {path} does not load as a PEM certificate ({exc})") from None


def check_cert_dates(path: str, name: str, reissue: str, now: datetime.datetime | None = None) -> None:
    """IdentityError (naming the file and its validity dates) when the certificate at
    ``path`` is not valid ``now``; ``reissue`` is the command that makes a new one."""
    cert = _first_cert(path, name)
    now = now or datetime.datetime.now(datetime.timezone.utc)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    dates = f"{start:%Y-%m-%d %H:%M:%S} UTC to {end:%Y-%m-%d %H:%M:%S} UTC"
    if now > end:
        raise IdentityError(f"{name} {path} has expired: it was valid from {dates}; issue a new one ({reissue})")
    if now < start:
        raise IdentityError(f"{name} {path} is not valid yet: it is valid from {dates} (is this "
                            "machine's clock right?)")


CLOCK_HINT_S = 3600  # a certificate valid for less than this, or for at most this much longer: said


def clock_hint(path: str, now: datetime.datetime | None = None) -> str:
    """What to say of a certificate that a peer refused though it is valid on this machine's
    clock, when its validity began or ends within ``CLOCK_HINT_S`` of now: a peer whose clock
    is that far behind (or ahead) takes it for not valid yet (or expired), with the same alert
    as a certificate signed by another CA, so the refusal alone cannot tell (review 37: issued
    on a machine 15 minutes ahead; certificates are back-dated only 5). "" otherwise."""
    try:
        cert = _first_cert(path, "the controller's certificate")
    except IdentityError:
        return ""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if (now - start).total_seconds() < CLOCK_HINT_S:
        return (f"; or the host's clock is behind this machine's: the certificate is valid only from "
                f"{start:%Y-%m-%d %H:%M:%S} UTC ({_ago(now - start)} ago here)")
    if (end - now).total_seconds() < CLOCK_HINT_S:
        return (f"; or the host's clock is ahead of this machine's: the certificate expires at "
                f"{end:%Y-%m-%d %H:%M:%S} UTC (in {_ago(end - now)} here)")
    return ""


def _ago(delta: datetime.timedelta) -> str:
    secs = int(delta.total_seconds())
    return f"{secs // 60} min {secs % 60} s" if secs >= 60 else f"{secs} s"


def check_cert_purpose(path: str, name: str, *, client: bool) -> None:
    """IdentityError when the certificate at ``path`` is not for a TLS client (``client``)
    or server, by its extended key usage (none: any purpose)."""
    from cryptography import x509  # imported only where used

    cert = _first_cert(path, name)
    try:  # (a key usage without digitalSignature signs no TLS handshake: a CA's, `fuse host ca create`'s;
        # it passed, having no extended key usage, and every peer refused it)
        signs = cert.extensions.get_extension_for_class(x509.KeyUsage).value.digital_signature
    except x509.ExtensionNotFound:
        signs = True
    if not signs:
        raise IdentityError(f"{name}: {path} cannot sign a TLS handshake (its key usage lacks digitalSignature"
                            f"{': a CA' + chr(39) + 's certificate' if _is_ca(cert) else ''}): issue one with "
                            f"`fuse host cert issue{' --client' if client else ''}` (and keep the CA's key off the host)")
    try:
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return
    want = x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH if client else x509.oid.ExtendedKeyUsageOID.SERVER_AUTH
    if want not in usage:
        names = ", ".join(getattr(o, "_name", o.dotted_string) for o in usage)
        if client:
            raise IdentityError(f"{name}: {path} is not a client certificate (its purposes: {names}), so "
                                "every mutual-TLS host would refuse it; issue the controller's with "
                                "`fuse host cert issue --client`")
        raise IdentityError(f"{name}: {path} is not a server certificate (its purposes: {names}), so every "
                            "controller would refuse it; issue the host's without --client")


def check_ca_file(path: str, name: str) -> None:
    """IdentityError when the CA file at ``path`` holds a certificate that is no CA's (a
    leaf, which signs no certificate to trust)."""
    from cryptography import x509  # imported only where used

    _regular_file(path, name)
    with open(path, "rb") as f:
        cas = x509.load_pem_x509_certificates(f.read())
    now = datetime.datetime.now(datetime.timezone.utc)
    for ca in cas:
        if not _is_ca(ca):
            raise IdentityError(f"{name}: {path} holds a certificate that is not a CA's "
                                f"({ca.subject.rfc4514_string()}), which signs no certificate to trust; give "
                                "the CA's ca.pem (`fuse host ca create`)")
    if cas and all(now > ca.not_valid_after_utc for ca in cas):  # (one valid beside: a CA being replaced)
        ca = cas[0]
        raise IdentityError(f"{name}: the CA certificate in {path} ({ca.subject.rfc4514_string()}) has expired "
                            f"(it was valid until {ca.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC), so the peers' "
                            "certificates would read as expired: make a new CA with `fuse host ca create` and "
                            "issue the certificates again from it")


def _is_ca(cert) -> bool:
    from cryptography import x509  # imported only where used

    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


# Identity failures already logged, so a poller meeting one every second logs it once.
_told: set[str] = set()
# Failures no transport foresaw (`HostConnection.request`), logged with their traceback once each.
_unforeseen: set[str] = set()


def _identity_context(tls: TlsSettings, addr: str) -> ssl.SSLContext:
    """The controller's TLS context for `addr`, or NotTrusted (nothing was sent) saying
    which of its files (set by PUT /v1/controller) cannot be used, e.g. moved away since."""
    try:
        ctx = tls.context()
    except IdentityError as exc:
        # the key's path stays in the controller's log: replies and events, which any holder
        # of the API token reads, never show it (as GET /v1/controller does not)
        said = str(exc).replace(tls.key, "(its path is in the controller's log)") if tls.key else str(exc)
        err = NotTrusted(f"TLS with {addr} cannot start: {said}; PUT /v1/controller with a usable cert, key and ca")
        err.maybe_sent = False  # (nothing went out: a create may try another host)
        if str(exc) not in _told:
            _told.add(str(exc))
            log.warning("the controller's TLS identity cannot be used: %s", exc)
        raise err from None
    _told.clear()
    return ctx


RETRY_BACKOFF_S = 0.2  # the first pause before a retry; each next one doubles
IDEMPOTENT = ("GET", "HEAD")
# The most of one answer a host's API is read for: past a move's largest file chunk (64 MiB),
# far past any listing. A host answering more (a broken or hostile one) is no agent: the
# controller reads no further, however much it sends (it used to read it whole, each poll).
MAX_ANSWER_BYTES = 64 * 2**20
MAX_FACTS_BYTES = 4 * 2**20  # a host's facts (GET /v1/host): a few KiB from any agent
PROBE_S = 1.0  # how long a look at whether a mutual-TLS host refuses our certificate may take (a failure only)
LOOK_S = 1.0   # how long a look at what listens at an address that could not be reached may take (`_wrong_protocol`)
UNFORESEEN_TOLD_MAX = 256
# A kept-alive connection idle longer than this is not used again (httpx's default is 5 s, the
# agent's own keep-alive: a create sent on one idle ~5 s met the agent closing it, a broken pipe
# on a request the agent never read, answered "may still create it" and tried on no other host).
# The agent's timer starts when it sends an answer, ours when it has come: ours is the shorter.
KEEPALIVE_EXPIRY_S = 2.0
_LIMITS = httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S)


@functools.cache
def _plain_context() -> ssl.SSLContext:
    """The one TLS context of every plain http:// and unix:// host client, which uses none
    (httpx builds one per client otherwise, loading a CA file each time: ~30-90 ms of the
    event loop per host at a controller's start)."""
    return ssl.create_default_context()

# How a peer hanging up reads, in httpx's words and OpenSSL's.
# (A broken pipe is a write meeting one: the peer hung up while the request was still going out.)
_HUNG_UP = ("server disconnected without sending", "connection reset", "unexpected eof", "eof occurred",
            "peer closed connection", "broken pipe")


def _describe(exc: Exception, address: Address, handshake: str = "",
              identity: "TlsSettings | None" = None, refused: bool = False) -> tuple[str, bool]:
    """One sentence saying why a host could not be reached, and whether it was a
    matter of trust (a certificate either side refused: a mistake, not an outage).
    `handshake`: this request began a TLS handshake and got no answer: "cut" when the
    handshake did not finish, "done" when it did (and then no answer came). `refused`:
    a mutual-TLS host that hung up right after the handshake was seen to refuse the
    controller's certificate (`HostConnection._refuses_us`)."""
    addr = address.text
    # httpx wraps the OS error ("All connection attempts failed"): read the chain.
    chain = _chain(exc)
    if isinstance(exc, httpx.TimeoutException):
        # Before the text checks: a timed-out handshake's chain mentions SSL, and an
        # exception's class name ("ConnectTimeout") is not a reason.
        return _timed_out(exc, addr, handshake == "cut"), False
    text = _said(chain)
    low = _words(chain)
    if address.kind == "tls":
        tls, untrusted = _describe_tls(chain, low, addr, handshake, identity, refused)
        if tls:
            return tls, untrusted
    elif why := _verify_failed(chain, low):
        # An https:// host whose certificate does not verify was reached: trust failed,
        # a mistake to fix (as with a mutual-TLS host's), not an outage to register around.
        return (f"TLS with {addr} failed: the host's certificate is not trusted ({why}); it must be signed by a "
                "CA the controller trusts (certifi's bundle, or SSL_CERT_FILE or SSL_CERT_DIR where the controller "
                "runs), unexpired, and name the address's host"), True
    tls_error = next((c for c in chain if isinstance(c, ssl.SSLError)), None)
    if tls_error is not None and any(s in low for s in _HUNG_UP):
        return _cut_in_handshake(addr), False
    if tls_error is not None or "certificate" in low or "ssl" in low or "tls" in low:
        # OpenSSL's reason in words, not its text ("[SSL: X] ... (_ssl.c:1006)")
        why = (tls_error.reason or "").replace("_", " ").lower() if tls_error is not None else ""
        return f"TLS with {addr} failed: {why or text}", False
    if _bad_name(exc):
        return f"cannot resolve the host name in {addr}: it is not a valid host name ({text})", False
    if "name or service not known" in low or "nodename nor servname" in low or "temporary failure in name" in low:
        gai = next((c for c in chain if isinstance(c, socket.gaierror)), None)  # (its text: "[Errno -2] ...")
        why = (gai.strerror if gai is not None and gai.strerror else text).lower()
        return f"cannot resolve the host name in {addr}: {why}", False
    if "connection refused" in low or "errno 111" in low:
        if address.kind == "local" and (what := _not_a_socket(address.path or default_agent_socket())):
            return f"{address.path or default_agent_socket()} is {what}, not a socket: is it the host agent's " \
                   "socket path?", False
        return f"connection to {addr} was refused: is the host agent running?", False
    if isinstance(exc, (FileNotFoundError,)) or "no such file" in low:
        where = address.path or default_agent_socket()
        return f"no host agent socket at {where}: is the host agent running?", False
    if any(s in low for s in _HUNG_UP):
        return _dropped(addr, chain), False
    if any(type(c).__name__ == "RemoteProtocolError" for c in chain):
        # (never what it sent: httpx quotes the bytes, "illegal status line: bytearray(b'...')")
        return f"{addr} answered with something that is not HTTP", False
    return f"cannot reach {addr}: {text}", False


def _not_a_socket(path: str) -> str:
    """What ``path`` is when it is there and no socket ("a regular file", "a directory"), else
    "": connecting to it is refused as to a socket no agent listens on, which it is not."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return ""
    return "" if stat.S_ISSOCK(mode) else _file_kind(mode)


def _bad_name(exc: BaseException) -> bool:
    """Whether `exc` is the resolver's idna codec (a bare UnicodeError: an empty label, one
    over 63 characters) or httpx's idna package (IDNAError) refusing the address's host name."""
    return any(type(c) is UnicodeError or isinstance(c, idna.IDNAError) for c in _chain(exc))


def _words(chain: list[BaseException]) -> str:
    """What the exception chain says, in lower case, with what its classes say unsaid."""
    low = " ".join(str(c).lower() for c in chain)
    if any(isinstance(c, ConnectionRefusedError) for c in chain):
        low += " connection refused"
    if any(isinstance(c, FileNotFoundError) for c in chain):
        low += " no such file"
    if any(type(c).__name__ == "BrokenResourceError" for c in chain):
        # (anyio's, with nothing said: a read on a connection a write already found hung up)
        low += " broken pipe"
    return low


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it wraps, outermost first; an exception group's members (anyio's
    "multiple connection attempts failed", one an address a name resolves to) in their turn."""
    chain: list[BaseException] = []
    todo: list[BaseException] = [exc]
    while todo and len(chain) < 8:
        cur = todo.pop(0)
        chain.append(cur)
        if (under := cur.__cause__ or cur.__context__) is not None:
            todo.insert(0, under)
        elif isinstance(cur, BaseExceptionGroup):
            todo[:0] = cur.exceptions
    return chain


# OpenSSL's reasons for a handshake answered with bytes that are not TLS at all.
_NOT_TLS = ("WRONG_VERSION_NUMBER", "UNKNOWN_PROTOCOL", "PACKET_LENGTH_TOO_LONG")


def _not_tls(exc: BaseException, address: Address) -> str:
    """Why `address` is a wrong address, when what answered its TLS handshake does
    not speak TLS (a plain-HTTP agent, an sshd), or "" when that is not what failed."""
    if not any(isinstance(c, ssl.SSLError) and c.reason in _NOT_TLS for c in _chain(exc)):
        return ""
    if address.kind == "tls":
        return (f"{address.text} does not speak TLS, so it is not a host agent's mutual-TLS listener (an agent "
                "serving plain HTTP is registered as http://HOST:PORT with its token)")
    return (f"{address.text} does not speak TLS, so it is not an https:// address (an agent serving plain "
            "HTTP is registered as http://HOST:PORT)")


async def greeting(host: str, port: int, say: bytes = b"", timeout: float = 0.5) -> bytes:
    """The first bytes a server at host:port sends (after `say`, if given) within
    `timeout`, or b"": how a wrong address is told from an outage. An SSH server
    announces itself unasked ("SSH-2.0-..."); an HTTP server answers an SSH
    client's greeting with "HTTP/1.1 400"; a host agent says nothing unasked."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, asyncio.TimeoutError, UnicodeError):  # (UnicodeError: a name the resolver cannot encode)
        return b""
    try:
        if say:
            writer.write(say)
            await asyncio.wait_for(writer.drain(), max(deadline - loop.time(), 0.01))
        return await asyncio.wait_for(reader.read(256), max(deadline - loop.time(), 0.01))
    except (OSError, asyncio.TimeoutError):
        return b""
    finally:
        writer.close()


async def _ssh_server(address: Address, listener: str, timeout: float = 0.5) -> str:
    """Why `address` is a wrong address when an SSH server listens there (it greets
    unasked, "SSH-2.0-..."), `listener` being what the address was taken for; "" when
    none does."""
    port = address.port or (443 if address.text.lower().startswith("https://") else 80)
    if (await greeting(address.host, port, timeout=timeout)).startswith(b"SSH-"):
        return (f"{address.text} is an SSH server, not {listener} (a host reached over SSH is registered as "
                "ssh://USER@HOST:PORT)")
    return ""


async def speaks_tls(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether what listens at host:port answers a TLS handshake as TLS (finishing it,
    or refusing it with an alert, as a mutual-TLS listener does a client without a
    certificate); False when it answers with something else, hangs up, or says nothing
    within `timeout`. Nothing is verified: it only tells a protocol from another."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=ctx), timeout)
    except ssl.SSLError as exc:
        return exc.reason not in _NOT_TLS and "EOF" not in str(exc)
    except (OSError, asyncio.TimeoutError, UnicodeError):
        return False
    writer.close()
    return True


def _describe_tls(chain: list[BaseException], low: str, addr: str, handshake: str,
                  identity: "TlsSettings | None" = None, refused: bool = False) -> tuple[str | None, bool]:
    """Say which side of a mutual-TLS handshake said no (and that it is a matter of
    trust). Only the handshake can refuse the controller's certificate: a connection
    that answered before and hangs up now was dropped, and says so."""
    if why := _verify_failed(chain, low):
        return (f"TLS with {addr} failed: the host's certificate is not signed by the controller's CA "
                f"or is not valid ({why})"), True
    # The host says no with an alert (bad certificate, unknown ca, certificate
    # required) or, with TLS 1.3, where it checks our certificate after the
    # handshake, by hanging up before it answers the request that shook hands
    # (a reset or a broken pipe as the request goes out may come before the alert
    # is read): then only `refused`, seen on a connection of its own, tells that
    # from a host that got the request and died.
    hung_up = any(s in low for s in _HUNG_UP)
    if _alert(low) or (handshake == "done" and hung_up and refused):
        why = (f"TLS with {addr} failed: the host refused the controller's certificate (it must be signed "
               "by the host's CA, unexpired, and issued with --client)")
        if identity is not None:
            try:  # (the likeliest cause, when it is so, said: not left to a guess)
                identity.check_dates()
                why += clock_hint(identity.cert)
            except IdentityError as expired:
                why = f"{why}: {expired}"
        return why, True
    if handshake == "cut" and hung_up:
        # closed before the handshake's first answer, with no alert: no TLS server said no
        # (a port forward or proxy with nothing behind it looks so), not a certificate to reissue
        return _cut_in_handshake(addr) + ": nothing speaking TLS seems to be behind the address", False
    if hung_up:
        return _dropped(addr, chain), False
    return None, False


def _alert(low: str) -> bool:
    """Whether OpenSSL's words are a TLS alert that refuses (not the close notify that ends
    a connection in good order)."""
    return "alert" in low and "close notify" not in low


def _hung_up_after_handshake(exc: BaseException, handshake: str) -> bool:
    """Whether a mutual-TLS request met a hang-up, with no alert read, right after its
    handshake: the host refusing the controller's certificate, or one that got the request
    and died, which only a look at the host tells apart (`HostConnection._refuses_us`)."""
    low = _words(_chain(exc))
    return (handshake == "done" and any(s in low for s in _HUNG_UP) and not _alert(low)
            and not isinstance(exc, httpx.TimeoutException))


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
    """The OS's own words for the error the chain holds (review 36: anyio's "All connection
    attempts failed" wraps "[Errno 113] Connect call failed", which is "no route to host"),
    else the first thing it says; never a bare class name."""
    os_error = next((c for c in chain if isinstance(c, OSError) and not isinstance(c, ssl.SSLError)
                     and c.errno in errno.errorcode), None)  # (an SSLError's errno is OpenSSL's)
    if os_error is not None:
        return os.strerror(os_error.errno).lower()
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


def _cut_in_handshake(addr: str) -> str:
    return f"the connection to {addr} was closed during the TLS handshake, before the host answered it"


def _dropped(addr: str, chain: list[BaseException]) -> str:
    # (an OS error in its words, not "[Errno 104] ..."; httpx's ReadError('') says nothing)
    said = next(((c.strerror.lower() if isinstance(c, OSError) and c.strerror else str(c)) for c in chain
                 if str(c)), "")
    return f"the connection to {addr} was dropped before the host answered" + (f" ({said})" if said else "")


def _never_sent(exc: BaseException) -> bool:
    """The connection failed before a byte of the request went: not opened (refused, no
    socket, no route, a failed handshake) or no connection free in the pool."""
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, UnicodeError)):
        return True  # (UnicodeError: a host name that could not even be looked up)
    cur: BaseException | None = exc
    while cur is not None:
        if isinstance(cur, (ConnectionRefusedError, FileNotFoundError)):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


class _Look:
    """The look at what listens at a diagnosed address (`HostConnection._wrong_protocol`) for
    one request: begun LOOK_S before the request would time out (at once, should it fail
    sooner), so a silent address still fails within the time its reason quotes (review 35:
    the look came after the timeout, each of its two connections up to a second more)."""

    def __init__(self, conn: "HostConnection", bound: float | None):
        self._conn = conn
        self._task: asyncio.Task | None = None
        self._limit = min(LOOK_S, bound) if bound else LOOK_S
        self._timer = (asyncio.get_running_loop().call_later(max(bound - LOOK_S, 0.0), self.start)
                       if bound else None)

    def start(self) -> "asyncio.Task[str]":
        if self._task is None:
            self._task = asyncio.ensure_future(self._conn._look(self._limit))
        return self._task

    def stop(self) -> None:
        """The request is over: a look not begun never is, one under way is dropped."""
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None and not self._task.done():
            self._task.cancel()


class HostConnection:
    """A connection to one host's API over the transport its address names."""

    def __init__(self, addr: str, token: str | None = None, tls: TlsSettings | None = None,
                 timeout: float = 10.0, diagnose: bool = False):
        """`diagnose`: when an http:// or ssh:// host cannot be reached, look at what
        listens there (`_wrong_protocol`), so an sshd at an http:// address, or an HTTP
        server at an ssh:// one, is said to be a wrong address (`NotAnAgent`) rather
        than an outage. For the registration probe, where that decides what is stored."""
        self.addr = addr
        self.diagnose = diagnose
        self._tls = tls
        self.address = parse_address(addr)  # BadAddress (400) before anything is dialled
        self.kind = self.address.kind
        self.token = token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._ssh = None
        self._busy = 0  # requests under way: a retired connection closes once none is
        self._retired = False
        # Every client is made with trust_env=False: a host is dialled at the address it was
        # registered with, never through HTTP_PROXY / HTTPS_PROXY / ALL_PROXY in the controller's
        # environment (httpx's default followed them: with the proxy down every http:// host was
        # "refused ... is the host agent running?", the agents' tokens went to it, and a socks5://
        # ALL_PROXY failed each connection's making, httpx lacking socksio). Set on the clients
        # with a transport of their own too, whose proxies httpx does not read today.
        if self.kind == "local":
            path = self.address.path or str(default_agent_socket())
            self._client = httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(uds=path, limits=_LIMITS, verify=_plain_context()),
                base_url="http://agent", headers=headers, timeout=timeout, trust_env=False)
        elif self.kind == "http":
            # (an https:// one verifies as httpx does: certifi's bundle, or SSL_CERT_FILE / SSL_CERT_DIR
            # where the controller runs, which trust_env=False would otherwise drop; read per client,
            # so a bundle changed since is the next connection's)
            verify = _plain_context() if addr.lower().startswith("http://") else httpx.create_ssl_context()
            self._client = httpx.AsyncClient(base_url=addr, headers=headers, timeout=timeout, limits=_LIMITS,
                                             verify=verify, trust_env=False)
        elif self.kind == "tls":
            if tls is None:
                err = NotTrusted(f"{addr} is a mutual-TLS address but the controller has no "
                                 "certificate: PUT /v1/controller with cert, key and ca first")
                err.maybe_sent = False  # (nothing went out: a create may try another host)
                raise err
            self._ctx = _identity_context(tls, addr)
            self._client = httpx.AsyncClient(base_url=f"https://{addr}", verify=self._ctx,
                                             headers=headers, timeout=timeout, limits=_LIMITS, trust_env=False)
        else:
            from .ssh import SshTransport  # imported only where used: asyncssh is heavy
            self._ssh = SshTransport(addr)
            self._client = httpx.AsyncClient(transport=self._ssh, base_url="http://agent",
                                             headers=headers, timeout=timeout, trust_env=False)

    async def request(self, method: str, path: str, *, json: Any = None, params: dict | None = None,
                      content: bytes | None = None, timeout: float | None = None,
                      retries: int = 0, max_bytes: int = MAX_ANSWER_BYTES) -> httpx.Response:
        """Send one request. `retries` (GET and HEAD only: never a call that
        changes anything) sends it again, after a short doubling pause, when
        the connection failed; a timeout is not retried, so a host that went
        away still fails the call in `timeout`. An answer longer than `max_bytes`
        (as sent, or decoded) is `NotAnAgent`, read no further."""
        if retries and method.upper() not in IDEMPOTENT:
            raise ValueError(f"{method} is not idempotent: it is never retried")
        kw: dict[str, Any] = {}
        if timeout is not None:
            kw["timeout"] = timeout
        # Whether this request shook hands and then got no answer: only then
        # can a hang-up be the host refusing our certificate.
        shook: list[str] = []

        async def trace(event: str, info: dict) -> None:
            if event in ("connection.start_tls.started", "connection.start_tls.complete",
                         "http11.receive_response_headers.complete"):
                shook.append(event)

        if self.kind == "tls" or self.address.text.lower().startswith("https://"):
            kw["extensions"] = {"trace": trace}  # (whether a TLS handshake began: see _describe)
        # (built before anything is sent: a body that cannot be encoded is the caller's bug, not the host's)
        req = self._client.build_request(method, path, json=json, params=params, content=content, **kw)
        look = _Look(self, self._bound(timeout)) if self._diagnosable() else None
        self._busy += 1
        try:
            attempt = 0
            while True:
                shook.clear()
                try:
                    return await self._bounded(req, max_bytes)
                except HostUnreachable as exc:  # (the SSH transport's own, already one sentence)
                    if type(exc) is HostUnreachable and (wrong := await self._wrong_protocol(look)):
                        err = NotAnAgent(wrong)
                        err.maybe_sent = getattr(exc, "maybe_sent", True)
                        raise err from exc
                    raise
                # (UnicodeError: a host name the resolver or httpx's idna cannot encode, stored
                # before `parse_address` refused it: unreachable, never a 500)
                except (httpx.TransportError, OSError, ssl.SSLError, UnicodeError) as exc:
                    if isinstance(exc, UnicodeError) and not _bad_name(exc):
                        raise  # (another text that cannot be encoded: not the host's doing)
                    if attempt == retries or isinstance(exc, httpx.TimeoutException):
                        handshake = ("" if "connection.start_tls.started" not in shook
                                     or "http11.receive_response_headers.complete" in shook
                                     else "done" if "connection.start_tls.complete" in shook else "cut")
                        refused = (self.kind == "tls" and _hung_up_after_handshake(exc, handshake)
                                   and await self._refuses_us())
                        why, untrusted = _describe(exc, self.address, handshake=handshake, identity=self._tls,
                                                   refused=refused)
                        kind = NotTrusted if untrusted else HostUnreachable
                        # what answered speaks another protocol: a wrong address, not an outage
                        if wrong := await self._not_tls(exc) or (kind is HostUnreachable and
                                                                 await self._wrong_protocol(look)):
                            why, kind = wrong, NotAnAgent
                        err = kind(why)
                        # whether the host may have got the request: a create it got may still land.
                        # A certificate refused by the handshake this request began is a connection
                        # that never opened: the host's app never saw the request.
                        err.maybe_sent = not (_never_sent(exc) or (untrusted and handshake != ""))
                        raise err from exc
                except Exception as exc:
                    # A failure no clause above foresaw (a transport's or a library's): still one
                    # sentence, since every caller (the poller, usage, a create and its settling)
                    # handles HostUnreachable: one such error 500'd the fleet's usage, left a host
                    # connected with a traceback each poll and a create's record held (review 35).
                    # It may have gone out, so a create that met it is held until the host says.
                    self._tell_unforeseen(exc)
                    err = HostUnreachable(f"cannot reach {self.address.text}: the connection failed unexpectedly "
                                          f"({type(exc).__name__}: {exc}); the controller's log has the details")
                    err.maybe_sent = True
                    raise err from exc
                await asyncio.sleep(RETRY_BACKOFF_S * 2 ** attempt)
                attempt += 1
        finally:
            if look is not None:
                look.stop()
            self._busy -= 1
            if self._retired and not self._busy:
                await self.close()

    async def _bounded(self, req: httpx.Request, max_bytes: int) -> httpx.Response:
        """The answer to ``req``, its body read to at most ``max_bytes``."""
        resp = await self._client.send(req, stream=True)
        try:
            declared = resp.headers.get("content-length", "")
            too_long = declared.isdigit() and int(declared) > max_bytes
            body, got = [], 0
            if not too_long:
                async for chunk in resp.aiter_bytes():
                    got += len(chunk)
                    if got > max_bytes:
                        too_long = True
                        break
                    body.append(chunk)
            if too_long:
                err = NotAnAgent(f"{self.address.text} answered {req.method} {req.url.path} with more than "
                                 f"{max_bytes} bytes: no host agent's answer is that long")
                err.maybe_sent = True
                raise err
        finally:
            await resp.aclose()
        # the body as read (decoded): the answer callers get reads like any other
        headers = [(k, v) for k, v in resp.headers.multi_items()
                   if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
        return httpx.Response(resp.status_code, headers=headers, content=b"".join(body), request=req,
                              extensions=resp.extensions)

    async def _refuses_us(self) -> bool:
        """Whether this mutual-TLS host refuses the controller's certificate, seen on one more
        connection asking a read (GET /v1/host, as every poll does): the host says no with an
        alert, or hangs up on it at once without a word (an agent's TLS stack drops a client
        whose certificate fails and sends no alert: with TLS 1.3 it checks the certificate
        after the client's side of the handshake is done). False when it answers in HTTP,
        says nothing within a second or cannot be reached: it is not known to refuse, so a
        request that met a hang-up may have gone."""
        a = self.address
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PROBE_S
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(a.host, a.port, ssl=self._ctx, server_hostname=a.host), PROBE_S)
        except ssl.SSLError as exc:
            return _alert(str(exc).lower())
        except (OSError, asyncio.TimeoutError, UnicodeError):
            return False
        try:
            host = f"[{a.host}]" if ":" in a.host else a.host
            writer.write(f"GET /v1/host HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            await asyncio.wait_for(writer.drain(), max(deadline - loop.time(), 0.01))
            answer = await asyncio.wait_for(reader.read(5), max(deadline - loop.time(), 0.01))
        except ssl.SSLError as exc:
            return _alert(str(exc).lower()) or "eof" in str(exc).lower()
        except (ConnectionResetError, BrokenPipeError):
            return True  # (hung up on a read that shook hands: the refusal's other form)
        except (OSError, asyncio.TimeoutError):
            return False
        finally:
            writer.close()
        return answer == b""  # (an answer in HTTP: it took the certificate)

    async def _not_tls(self, exc: BaseException) -> str:
        """Why this TLS address is a wrong one when what answered its handshake does not
        speak TLS (`_not_tls`), naming an sshd as one (it greets before the handshake
        can fail); "" when that is not what failed. The one more connection is made
        only then: an address that answered in another protocol."""
        wrong = _not_tls(exc, self.address)
        if wrong:
            a = self.address
            listener = "a host agent's mutual-TLS listener" if a.kind == "tls" else "a host agent's HTTPS listener"
            wrong = await _ssh_server(a, listener) or wrong
        return wrong

    def _tell_unforeseen(self, exc: BaseException) -> None:
        key = f"{self.address.text} {type(exc).__name__} {exc}"
        if key not in _unforeseen:
            if len(_unforeseen) >= UNFORESEEN_TOLD_MAX:
                _unforeseen.clear()
            _unforeseen.add(key)
            log.error("a request to %s failed unexpectedly (a bug to report)", self.address.text,
                      exc_info=(type(exc), exc, exc.__traceback__))

    def _diagnosable(self) -> bool:
        """Whether a failure here is looked into (`_wrong_protocol`): `diagnose`, at an http:// or ssh:// address."""
        a = self.address
        return self.diagnose and a.kind in ("http", "ssh") and not a.text.lower().startswith("https://")

    def _bound(self, timeout: float | None) -> float | None:
        """The time a request to a silent address takes to fail, which its reason quotes: the
        request's timeout (the client's when not given), FUSE_SSH_CONNECT_TIMEOUT if tighter
        over SSH; None for none."""
        t = timeout if timeout is not None else self._client.timeout.read
        if self.kind == "ssh":
            from .ssh import SshOptions
            try:
                ssh_t = SshOptions.from_env().connect_timeout
            except ValueError:  # (a bad setting: the request says so itself)
                ssh_t = None
            t = min(x for x in (t, ssh_t, float("inf")) if x)
        return t if t and t != float("inf") else None

    async def _wrong_protocol(self, look: "_Look | None" = None) -> str:
        """With `diagnose`, why an http:// or ssh:// address that could not be reached is a
        wrong one (what listens there speaks the other protocol), or "": the result of `look`,
        begun before the request would time out, else of a look begun now."""
        if not self._diagnosable():
            return ""
        return await (look.start() if look is not None else asyncio.ensure_future(self._look(LOOK_S)))

    async def _look(self, limit: float) -> str:
        """What listens at this address when it speaks the other protocol, in one sentence, or
        "". One more connection or two at once, at most `limit`: a fuse agent says nothing unasked,
        an sshd greets at once, an HTTP server answers an SSH greeting with "HTTP/1.1 400",
        and a TLS server answers a handshake."""
        a = self.address
        if a.kind == "http":
            port = a.port or 80
            sshd, tls = await asyncio.gather(_ssh_server(a, "a host agent's HTTP listener", min(0.5, limit)),
                                             speaks_tls(a.host, port, limit))
            if sshd:
                return sshd
            if tls:
                return (f"{a.text} speaks TLS, not plain HTTP, so it is not an http:// address (a host agent's "
                        "mutual-TLS listener is registered as HOST:PORT, with no scheme)")
            return ""
        port = a.port or 22
        said, tls = await asyncio.gather(greeting(a.host, port, say=b"SSH-2.0-fuse\r\n\r\n", timeout=limit),
                                         speaks_tls(a.host, port, limit))
        if said.startswith(b"HTTP/"):
            return (f"{a.text} speaks HTTP, not SSH, so it is not an ssh:// address (a host agent's HTTP "
                    "listener is registered as http://HOST:PORT with its token)")
        if tls:
            return (f"{a.text} speaks TLS, not SSH, so it is not an ssh:// address (a host agent's mutual-TLS "
                    "listener is registered as HOST:PORT, with no scheme)")
        return ""

    async def retire(self) -> None:
        """Close once the requests under way have their answers (a move's copy may be
        one, for minutes): the owner has a new connection for the next ones."""
        self._retired = True
        if not self._busy:
            await self.close()

    async def close(self) -> None:
        await self._client.aclose()
