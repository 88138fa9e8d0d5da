"""What a host address is: the one place an address is parsed.

    local                  this machine's agent socket
    unix://PATH            an agent socket at a given path
    http(s)://HOST[:PORT]  TCP with the agent's bearer token (a path is a prefix;
                           no user, password, query or fragment)
    ssh://[USER@]HOST[:PORT]
    HOST:PORT              the agent's mutual-TLS listener

`parse_address` either returns an `Address` or raises `BadAddress` (400
`invalid_argument`) naming the address and what is wrong with it: a port
outside 1-65535 or not a number, an IP literal that is not one (999.1.1.1,
an unclosed `[::1`) or holds an IPv6 zone id (`[fe80::1%eth0]`, which nothing
dials), no host, a host name with an empty label, a label over 63 characters or an `xn--`
label that is no IDNA (which the resolver and httpx refuse with a UnicodeError), no
socket path, an http(s) address with a user
or password (the agent's token is the credential: userinfo would be sent in
its place) or with a query or fragment (the address is stored and shown as
given, and a request path is appended to it). A password is never repeated
in a message. It is called before anything
is stored or dialled, so a typo never reaches a socket library, whose
complaints (OverflowError, httpx's InvalidURL) would otherwise surface as
500s. An address that parses but cannot be reached is not decided here: that
is `HostUnreachable` (502) from the transport, as is a host name that does
not resolve.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass

import httpx

from ..errors import InvalidArgument

FORMS = "local, unix://PATH, http(s)://HOST:PORT, ssh://USER@HOST[:PORT] or HOST:PORT"
KINDS = {"unix": "local", "http": "http", "https": "http", "ssh": "ssh"}  # scheme -> transport

_DOTTED = re.compile(r"[0-9.]+")          # looks like an IPv4 literal, so it must be one
_TLS_HOST = re.compile(r"[A-Za-z0-9_.\-]+")
_HOST_NAME = re.compile(r"[\w.\-]+")  # (\w: an internationalised name's letters too, as httpx encodes them)
_DIGITS = re.compile(r"[0-9]+")
# What a shell reads as more than a name (`;`, `$(...)`, backquotes, double quotes, globs,
# redirections, pipes): no login is named so, and a reason or hint that quotes the user would
# hand them to whoever pastes it. Directory logins hold none of them: `user@domain`,
# `DOMAIN+user`, winbind's `DOMAIN\user`, a machine account's `HOST$`, an `o'brien` (a `$`
# with no `(` runs nothing; the diff review: `\` refused made such hosts unreachable).
_SHELL_CHARS = frozenset(";`|&<>(){}\"*?[]")


class BadAddress(InvalidArgument, ValueError):
    """An address that cannot be an address. A ValueError as well, for the
    callers that parse outside a request (and did before this class)."""


@dataclass(frozen=True)
class Address:
    text: str               # as given (what is stored and shown is `normalise_address`'s spelling)
    kind: str               # local | http | ssh | tls
    host: str = ""          # lower case; an IPv6 literal without its brackets
    port: int | None = None  # None: the scheme's default
    user: str = ""          # ssh only; "" for the caller's default
    path: str = ""          # unix:// only; "" for `local` (the default socket)


def parse_address(addr: str) -> Address:
    """`addr` as an `Address`, or `BadAddress` saying why it cannot be one."""
    if addr == "local":
        return Address(addr, "local")
    scheme, sep, rest = addr.partition("://")
    if not sep:
        return _tls(addr)
    kind = KINDS.get(scheme.lower())  # (a scheme is case-insensitive: RFC 3986)
    if kind is None:
        raise BadAddress(_not_a_form(addr))
    if kind == "local":
        if not rest:
            raise _bad(addr, "it names no socket path (unix:///path/to/agent.sock)")
        if "\x00" in rest:
            raise _bad(addr, "the socket path contains a NUL character")
        # (a path ending in '/' names a directory, never a socket: `unix:///run/a.sock/` is the
        # socket /run/a.sock, as `http://h:8090/` is `http://h:8090`; kept, it was dialled as
        # given and failed with "[Errno 20] Not a directory")
        if not rest.rstrip("/"):
            raise _bad(addr, "it names no socket path, only '/' (unix:///path/to/agent.sock)")
        return Address(addr, "local", path=rest.rstrip("/"))
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    if kind == "http":
        if "@" in authority:
            raise _bad(addr, f"{scheme}:// addresses take no user or password: the host agent's token "
                             "is the credential (give it as token)")
        if "?" in tail or "#" in tail:
            raise _bad(addr, f"an {scheme}:// address has no query or fragment (only a path, as a prefix)")
    user, password, host, port = _authority(addr, authority)
    if kind == "ssh":
        if password is not None:
            raise _bad(addr, "ssh:// addresses take no password: fuse logs in with keys only")
        if tail not in ("", "/"):
            raise _bad(addr, "an ssh:// address has no path, query or fragment")
    else:
        # httpx is what dials it: whatever else it cannot take is said here, not at the first request.
        try:
            httpx.URL(addr)
        except httpx.InvalidURL as exc:
            raise _bad(addr, _lower_first(str(exc))) from None
    return Address(addr, kind, host=host, port=port, user=user)


def normalise_address(addr: str) -> str:
    """`addr` as the registry stores and compares it (`BadAddress` when it is
    not one, or a unix:// socket path that is relative): one spelling for each address,
    so registering it again spelt another way is not a move. The scheme and the host name
    in lower case (both are case-insensitive: `HTTP://LocalHost:1` is `http://localhost:1`),
    a port without leading zeros (`:080` is `:80`), any address without trailing slashes, which
    name nothing (`http://h:8090/` is `http://h:8090`; a path prefix `/p/` is `/p`; a socket
    path `/run/a.sock/` is `/run/a.sock`). An ssh user, an http path prefix and a socket path
    are otherwise kept as given.
    (None has a query or fragment: `parse_address`.)"""
    a = parse_address(addr)
    if a.kind == "local" and a.path and not a.path.startswith("/"):
        # (unix://run/a.sock is the path run/a.sock, read from the controller's working
        # directory, whichever that is when it dials: three slashes for an absolute one;
        # refused where an address is registered, so one stored before still loads)
        if _no_password(addr) != addr:  # (user:password@ before it: neither said back in clear)
            raise _bad(addr, "unix:// addresses take no user or password: give the socket's absolute path "
                             "(unix:///path/to/agent.sock)")
        raise _bad(addr, f"the socket path {a.path} is relative: give an absolute one (unix:///{a.path})")
    if a.kind == "local":  # (`local`, or a socket path: case-sensitive, as given)
        return f"unix://{a.path}" if a.path else addr
    # (a port written with leading zeros is stored without: `:080` registered again as `:80`
    # was read as another address, a move of the host to elsewhere; so was `LOCALHOST`)
    host = f"[{a.host}]" if ":" in a.host else a.host
    where = host + (f":{a.port}" if a.port is not None else "")
    if a.kind == "tls":
        return where
    scheme, _, rest = addr.partition("://")
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    info, at, _ = rest[:cut].rpartition("@")  # (ssh's user, as written: a login name is case-sensitive)
    return f"{scheme.lower()}://{info}{at}{where}{rest[cut:].rstrip('/')}"


@functools.lru_cache(maxsize=65536)
def transport_kind(addr: str) -> str:
    """local, http, ssh or tls; `BadAddress` for anything that is not an address. Cached:
    every poll of every host asks it of the stored url (~15-30 µs a parse)."""
    return parse_address(addr).kind


def on_this_machine(addr: str) -> bool:
    """Whether the agent at `addr` runs on this machine: a unix socket (`local`,
    `unix://PATH`) or a loopback host (`localhost`, 127.0.0.0/8, `::1`) over
    any transport. False for any other host, and for what is not an address."""
    try:
        a = parse_address(addr)
    except BadAddress:
        return False
    if a.kind == "local":
        return True
    if a.host == "localhost" or a.host.endswith(".localhost"):  # (RFC 6761: always loopback)
        return True
    try:
        return ipaddress.ip_address(a.host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def _tls(addr: str) -> Address:
    """HOST:PORT, the mutual-TLS form: a port is required, and a host is a
    name or an IP literal (no user, no path)."""
    if ":" not in addr or "/" in addr:
        raise BadAddress(_not_a_form(addr))
    _, _, host, port = _authority(addr, addr, userinfo=False)
    if port is None:
        raise _bad(addr, "a mutual-TLS address needs a port (HOST:PORT)")
    if ":" not in host and not _TLS_HOST.fullmatch(host):
        raise _bad(addr, f"{host!r} is not a host name or an IP address")
    return Address(addr, "tls", host=host, port=port)


def _authority(addr: str, authority: str, userinfo: bool = True) -> tuple[str, str | None, str, int | None]:
    """[USER[:PASSWORD]@]HOST[:PORT] -> (user, password or None, host, port or None)."""
    user, password = "", None
    if userinfo and "@" in authority:
        info, _, authority = authority.rpartition("@")
        user, colon, pw = info.partition(":")
        password = pw if colon else None
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise _bad(addr, "the IPv6 address after '[' has no closing ']'")
        host, after = authority[1:end], authority[end + 1:]
        try:
            ip = ipaddress.IPv6Address(host)
        except ValueError as exc:
            raise _bad(addr, f"[{host}] is not an IPv6 address ({_lower_first(str(exc))})") from None
        if ip.scope_id is not None:
            raise _bad(addr, _zone_problem(host))
        if after and not after.startswith(":"):
            raise _bad(addr, f"{after!r} follows the IPv6 address; only :PORT may")
        port_text = after[1:] if after else None
    else:
        if authority.count(":") > 1:
            raise _bad(addr, "an IPv6 address must be in brackets, as [::1]:PORT")
        host, colon, port_text = authority.partition(":")
        if not colon:
            port_text = None
        if host and _DOTTED.fullmatch(host):
            try:
                ipaddress.IPv4Address(host)
            except ValueError as exc:
                raise _bad(addr, f"{host} is not an IPv4 address ({_lower_first(str(exc))})") from None
    if not host:
        raise _bad(addr, "it names no host")
    if not authority.startswith("[") and not _HOST_NAME.fullmatch(host):
        # (a shell's `;`, `$(...)`, spaces: no host is named so, and the messages that
        # suggest a command with the host in it would hand them to a shell)
        raise _bad(addr, f"{_shown(host)} is not a host name or an IP address (letters, digits, '-', '_' and '.')")
    if not authority.startswith("[") and (why := _name_problem(host)):
        raise _bad(addr, f"{_shown(host)} is not a host name ({why})")
    if user and (any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in user)):
        # (`user@domain` and `DOMAIN+user` directory logins are names too)
        raise _bad(addr, f"user {_shown(user)} is not a login name (it holds a space or a control character)")
    if user and (shell := sorted(set(user) & _SHELL_CHARS)):
        raise _bad(addr, f"user {_shown(user)} is not a login name (it holds {' '.join(shell)}, which a shell "
                         "reads as more than a name)")
    if user.startswith("-"):  # (an ssh command line would read it as an option)
        raise _bad(addr, f"user {_shown(user)} is not a login name (it starts with '-')")
    return user, password, host.lower(), _port(addr, port_text)


def _zone_problem(host: str) -> str:
    """Why the IPv6 literal `host` with a zone id (`fe80::1%eth0`, RFC 6874's `::1%25lo`) is
    refused (review 38). `ipaddress` takes one, but no transport here dials it: httpx hands the
    whole text to the resolver ("name or service not known"), and following that message's
    advice to declare capacity stored a host that never connected."""
    bare, _, zone = host.partition("%")
    shown = f"%{zone}" if _HOST_NAME.fullmatch(zone) else _shown(f"%{zone}", 40)
    if ipaddress.IPv6Address(bare).is_link_local:  # (fe80::/10 is reached through no interface without one)
        return (f"IPv6 zone ids ({shown}) are not supported, and a link-local address is not reached without "
                "one; give another of the host's addresses, or its name")
    return f"IPv6 zone ids ({shown}) are not supported; give the address without one ([{bare}])"


def _name_problem(host: str) -> str:
    """Why the host name `host` cannot be one, or "": a label that is empty (`a..b`, `.a`;
    one dot at the end is the root's, so `a.` is a name) or longer than 63 characters as
    the resolver is given it, or an `xn--` name that is no IDNA A-label. The resolver
    (Python's idna codec: getaddrinfo, so every transport) and httpx (which decodes an
    `xn--` name) raise UnicodeError on these, which surfaced as 500s from a probe that
    dialled them; a name that is one but resolves nowhere is the transport's 502."""
    labels = (host[:-1] if host.endswith(".") else host).split(".")
    if "" in labels:
        return "it has an empty label: two dots in a row, or a dot at its start"
    for label in labels:
        try:
            label.encode("idna")
        except UnicodeError:
            return f"its label {_shown(label, 20)} is longer than 63 characters, as DNS is sent it"
    try:
        httpx.URL(f"http://{host}/").host
    except (UnicodeError, httpx.InvalidURL) as exc:  # (idna's IDNAError is a UnicodeError)
        return f"it is not a valid internationalised name: {_lower_first(str(exc))}"
    return ""


def _port(addr: str, text: str | None) -> int | None:
    if text is None:
        return None
    if not text:
        raise _bad(addr, "the port after ':' is empty")
    if not _DIGITS.fullmatch(text):
        raise _bad(addr, f"port {_shown(text)} is not a number from 1 to 65535")
    # (leading zeros are the port's too: `:042502` is 42502, and `normalise_address` stores it so)
    digits = text.lstrip("0") or "0"
    port = int(digits) if len(digits) <= 5 else 65536  # int() of thousands of digits is itself an error
    if not 1 <= port <= 65535:
        raise _bad(addr, f"port {text if len(text) <= 10 else text[:10] + '...'} is out of range "
                         "(a port is 1 to 65535)")
    return port


def _bad(addr: str, problem: str) -> BadAddress:
    return BadAddress(f"address {_shown(_no_password(addr))} is not valid: {problem}")


def _not_a_form(addr: str) -> str:
    return f"address {_shown(_no_password(addr))} is not {FORMS}"


def _no_password(addr: str) -> str:
    """`addr` with the password of its SCHEME://USER:PASSWORD@ part, if any, as ***:
    what a message may repeat (errors are logged and shown to whoever asked)."""
    scheme, sep, rest = addr.partition("://")
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    info, at, host = rest[:cut].rpartition("@")
    user, colon, _ = info.partition(":")
    if not (sep and at and colon):
        return addr
    return f"{scheme}://{user}:***@{host}{rest[cut:]}"


def _shown(text: str, limit: int = 100) -> str:
    """Quoted, and cut short: an error message never echoes a whole body."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]
