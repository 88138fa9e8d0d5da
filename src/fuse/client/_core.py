"""The SDK's core: it builds requests and reads responses, and does no I/O.

`Client` and `AsyncClient` only move bytes; every resource method returns a
`Call` that either of them sends, so one resource class serves both (in the
async client its methods return awaitables).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable, Union
from urllib.parse import quote

import httpx
from pydantic import BaseModel

DEFAULT_TIMEOUT = 60.0
# What a client's `timeout` may be (README): seconds, None for no limit, an httpx.Timeout or its tuple
TimeoutArg = Union[float, None, httpx.Timeout, "tuple[float | None, ...]"]
CLOSED = "this fuse client is closed"  # the ValueError of a call on a client after its close()
# A kept-alive connection idle longer than this is not used again: the controller's server
# closes one idle 5 s (httpx's own default expiry), and a request sent on one just then met
# it closing: a create the controller never read, reported `unreachable`.
LIMITS = httpx.Limits(keepalive_expiry=2.0)
INVALID_ANSWER = "invalid_answer"  # the code of an ApiError for an answer that is not the API's (no error body, not JSON)
UNREACHABLE = "unreachable"  # the code of an ApiError for a request that got no answer (status 0)


class ApiError(Exception):
    """An error answer from a fuse API: `status` (HTTP), `code` (stable,
    e.g. "conflict"), `message` (for people), `details` (the rest of the
    error object, e.g. `hosts` for fleet_full). A controller that could not
    be reached (refused, reset, no answer in time) is status 0, code
    "unreachable", with httpx's error as the `__cause__` and `details["sent"]`:
    True when the request went out (then the controller may have carried it out)."""

    def __init__(self, status: int, code: str = "", message: str = "", details: dict[str, Any] | None = None):
        self.status, self.code, self.message = status, code, message
        self.details = details or {}
        super().__init__(f"{status} {code}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        # (pickle's default re-calls the class with `args`, the one formatted line, taken for the
        # status: an error from a worker process came back as "404 not_found: ... : " (review 38))
        return type(self), (self.status, self.code, self.message, self.details), self.__dict__


def _api_error(err: object) -> ApiError | None:
    """The ApiError `err` is or carries in its __cause__/__context__ chain
    (an ApiError re-raised inside a caller's own exception still counts),
    as the published folsom-fuse client does."""
    seen: set[int] = set()
    todo = [err]
    while todo:  # (both links of each: `raise X from Y` inside an except keeps the ApiError as the context)
        err = todo.pop()
        if not isinstance(err, BaseException) or id(err) in seen:
            continue
        if isinstance(err, ApiError):
            return err
        seen.add(id(err))
        todo += [err.__context__, err.__cause__]  # (the cause first, then the context)
    return None


def _has_code(err: object, code: str) -> bool:
    found = _api_error(err)
    return found is not None and found.code == code


def is_conflict(err: object) -> bool:
    """The `conflict` code only (e.g. deregistering a host with VMs assigned:
    cordon, drain, retry), not every 409: host_full, vm_exists,
    move_in_progress and the like ask for something else."""
    return _has_code(err, "conflict")


def is_not_found(err: object) -> bool:
    return _has_code(err, "not_found")


def is_invalid_argument(err: object) -> bool:
    return _has_code(err, "invalid_argument")


NO_VALUE = object()


@dataclass
class Call:
    method: str
    path: str
    params: dict[str, Any] | None = None
    body: Any = None
    parse: Callable[[httpx.Response], Any] = field(default=lambda r: r.json() if r.content else None)
    timeout: float | None = None
    # a 404 not_found answered as this value instead of raising (remove_prewarm's False)
    not_found: Any = NO_VALUE


def finish(call: Call, resp: httpx.Response) -> Any:
    """The call's answer from a response: parsed, ``not_found``'s value, or ApiError."""
    if call.not_found is not NO_VALUE and resp.status_code == 404:
        try:
            check(resp)
        except ApiError as err:  # (the API's not_found only: a proxy's 404 page, or another server's, is no answer)
            if err.code == "not_found":
                return call.not_found
            raise
    check(resp)
    try:
        return call.parse(resp)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        # (not JSON, or not the record it should be: pydantic's errors are ValueErrors; a list's
        # key missing, or a dict where a list goes, the others)
        raise ApiError(resp.status_code, INVALID_ANSWER,
                       f"{call.method} {call.path} was answered {resp.status_code} with a body that is not the "
                       f"API's ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}): "
                       "is the url a fuse controller?") from exc


MAX_TIMEOUT = 365 * 24 * 3600.0  # a year: past ~1e9 s the sync client's socket timeout overflows


def check_timeout(timeout: Any) -> Any:
    """The client's ``timeout`` when it is one (seconds above 0 and at most a year, None for
    none, or an ``httpx.Timeout``), else ``ValueError`` where the client is made (review 34: any
    value was taken, and every call failed with the HTTP library's raw error — sync and async
    differently — or said a controller never asked "did not answer in time")."""
    if timeout is None:
        return timeout
    if isinstance(timeout, tuple):  # (httpx's (connect, read, write, pool) form)
        try:
            timeout = httpx.Timeout(timeout)
        except (TypeError, ValueError, IndexError) as exc:  # (IndexError: one shorter than 2, `(5,)`)
            raise ValueError(f"timeout {timeout!r} is no httpx timeout: {exc or type(exc).__name__}") from None
    if isinstance(timeout, httpx.Timeout):
        for part in (timeout.connect, timeout.read, timeout.write, timeout.pool):
            if part is not None:
                _seconds(part, timeout)
        return timeout
    return _seconds(timeout, timeout)


def _seconds(value: Any, timeout: Any) -> Any:
    """``value`` (a part of ``timeout``) when it is seconds above 0 and at most a year, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"timeout must be a number of seconds, an httpx.Timeout, or None, not "
                         f"{type(value).__name__} {value!r}")
    if not 0 < value <= MAX_TIMEOUT:  # (NaN fails this too)
        raise ValueError(f"timeout must be above 0 and at most {MAX_TIMEOUT:g} s (a year), or None for no limit: "
                         f"{timeout!r}")
    return value


def check_params(params: dict[str, Any] | None) -> None:
    """``ValueError`` for a query value no url can carry (a lone surrogate), said before
    anything is sent, as a path's is (the HTTP library's encoder raised UnicodeEncodeError)."""
    for key, value in (params or {}).items():
        if isinstance(value, str):
            _url_text(value, f"{key} ")


def _url_text(value: str, what: str = "") -> None:
    """``ValueError`` when ``value`` (named ``what``) holds a lone surrogate, which no url carries."""
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ValueError(f"{what}{value!r} is not text a url can carry (it holds a lone surrogate)") from None


def path(base: str, *parts: str) -> str:
    """`base` plus each part, percent-encoded (ids are free-form). A part of "." or
    ".." is sent as %2E: the URL library would take it for a dot segment and drop it
    (``hosts.get(".")`` read the host list as one empty host)."""
    for p in parts:  # (a lone surrogate: said here, not as the encoder's traceback)
        _url_text(p)
    return base + "".join("/" + (p.replace(".", "%2E") if p in (".", "..") else quote(p, safe=""))
                          for p in parts)


def body_json(body: Any) -> Any:
    if isinstance(body, BaseModel):
        return body.model_dump(mode="json", exclude_none=True)
    return body


def body_kw(body: Any) -> dict[str, Any]:
    """The request's body arguments: JSON, with every non-ASCII character escaped, so
    that a string no UTF-8 holds (a lone surrogate, ``"\\udfff"``) reaches the server,
    which refuses it as any bad field (400 ``invalid_argument``), instead of failing
    in the encoder with a ``UnicodeEncodeError``."""
    value = body_json(body)
    if value is None:
        return {}
    return {"content": json.dumps(value, separators=(",", ":"), allow_nan=False).encode("ascii"),
            "headers": {"Content-Type": "application/json"}}


def check(resp: httpx.Response) -> None:
    """Raise the ApiError of any answer but a 2xx (a 3xx too: the API never redirects)."""
    if 200 <= resp.status_code < 300:
        return
    code, message, details = "", resp.reason_phrase, {}
    try:
        err = resp.json().get("error", {})
        code, message = err.get("code", ""), err.get("message", message)
        # Extras come at the top of `error` and again under `error.details`
        # (the public Fuse API's place): one dict either way.
        details = {k: v for k, v in err.items() if k not in ("code", "message", "details")}
        if isinstance(err.get("details"), dict):
            details.update(err["details"])
    except Exception:
        pass
    if not code:  # not the API's error body (a proxy's page, say): said so, with what came
        code = INVALID_ANSWER
        message = (f"answered {resp.status_code} {resp.reason_phrase} without the API's error body "
                   f"(is the url a fuse controller?): {' '.join(resp.text.split())[:300]}")
    elif code == "no_route":  # a fuse server without the route: an agent's url, or a path prefix
        code, message = INVALID_ANSWER, f"answered {resp.status_code}: {message}"
    raise ApiError(resp.status_code, code, message, details)


# The errors of a request that never left this machine: no connection made (refused, no such
# name, none in time, none free in the pool), or no url httpx sends. Every other transport error
# came after the request was written, wholly or in part: the controller may have read it and
# done the work (a create: the VM may exist), so it is never worded as "cannot reach" (review 38).
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol,
            httpx.ProxyError, httpx.LocalProtocolError)


def unreachable(exc: httpx.TransportError, where: str, proxy: str | None = None) -> ApiError:
    """The ApiError for a request that got no answer (raise it `from exc`): `details["sent"]`
    says whether it was sent (then the controller may have carried it out)."""
    at = f"the controller at {where}" + (f" (through the proxy {shown_proxy(proxy)})" if proxy else "")
    why = str(exc) or type(exc).__name__
    if isinstance(exc, NOT_SENT):
        if isinstance(exc, httpx.TimeoutException):
            return ApiError(0, UNREACHABLE, f"{at} did not answer in time (no connection made: nothing was sent)",
                            {"sent": False})
        return ApiError(0, UNREACHABLE, f"cannot reach {at}: {why}", {"sent": False})
    if isinstance(exc, httpx.TimeoutException):
        said = "did not answer in time"
    else:
        said = f"closed the connection before answering ({why})"
    return ApiError(0, UNREACHABLE, f"{at} {said}: the request was sent and may have been carried out",
                    {"sent": True})


def unsendable(exc: httpx.InvalidURL, call: Call) -> ValueError:
    """The ValueError for a request that cannot be sent as a URL (a name of tens of KB, say):
    what cannot be sent is a ValueError, as a bad url or token is (README)."""
    return ValueError(f"{call.method} {call.path[:80]}{'...' if len(call.path) > 80 else ''} cannot be sent "
                      f"as a URL: {exc}")


def model(cls: type[BaseModel]) -> Callable[[httpx.Response], Any]:
    return lambda r: _model(cls, r.json())


def _model(cls: type[BaseModel], data: Any) -> Any:
    """``data`` read as a ``cls``, once it is one."""
    if isinstance(data, dict) and data.keys().isdisjoint(cls.model_fields):
        # (every field has a default on most records: ``{}`` read as an empty host)
        raise ValueError(f"none of the fields of a {cls.__name__}")
    return cls.model_validate(data)


def _items(data: Any, key: str | None) -> list:
    """The list under ``key`` of ``data`` (``data`` itself with no key), once it is a list:
    a catch-all's ``{"vms": {"a": 1}}`` was read as the VM list, a dict."""
    value = data[key] if key else data
    if not isinstance(value, list):
        raise TypeError(f"a JSON {type(value).__name__} where a list{f' of {key}' if key else ''} goes")
    return value


def record(*keys: str, exact: bool = False,
           inner: dict[str, type | tuple[str, ...]] | None = None) -> Callable[[httpx.Response], Any]:
    """The answer as the JSON object it is, once it holds ``keys`` (fields the API always
    writes in it): ``{}`` from a proxy's catch-all was a VM created, a drain done, a fleet
    of no hosts. ``exact``: numbers read as ``Decimal``. ``inner``: a field -> what it holds
    where the answer has it: ``dict`` (an object), ``list`` (a list), ``str`` (a list of strings) or a tuple of
    names (a list of objects, each holding them): a usage report's rows, a drain's lists."""
    def parse(r: httpx.Response):
        data = json.loads(r.content, parse_float=Decimal) if exact else r.json()
        if not isinstance(data, dict):
            raise TypeError(f"a JSON {type(data).__name__} where an object goes")
        if missing := [k for k in keys if k not in data]:
            raise ValueError(f"no {', '.join(missing)} field")
        for key, holds in (inner or {}).items():
            if key in data:
                _holds(data[key], key, holds)
        return data
    return parse


def _holds(value: Any, key: str, holds: type | tuple[str, ...]) -> None:
    """Raise unless ``value`` (the answer's field ``key``) is what ``record``'s ``inner`` says."""
    if holds is dict:
        if not isinstance(value, dict):
            raise TypeError(f"a JSON {type(value).__name__} as {key}, where an object goes")
        return
    for x in _items(value, None):  # (``list``: a list of anything)
        if holds is str and not isinstance(x, str):
            raise TypeError(f"a JSON {type(x).__name__} in the list of {key}, where a string goes")
        if isinstance(holds, tuple):
            if not isinstance(x, dict):
                raise TypeError(f"a JSON {type(x).__name__} in the list of {key}, where an object goes")
            if missing := [k for k in holds if k not in x]:
                raise ValueError(f"an item of {key} with no {', '.join(missing)} field")


def model_list(cls: type[BaseModel], key: str | None = None) -> Callable[[httpx.Response], Any]:
    """The answer's list (under ``key``) of ``cls`` records, each checked as ``model`` does."""
    return lambda r: [_model(cls, x) for x in _items(r.json(), key)]


def record_list(key: str, *keys: str) -> Callable[[httpx.Response], Any]:
    """The answer's list under ``key`` of JSON objects, each holding ``keys`` as ``record``'s does."""
    def parse(r: httpx.Response):
        items = _items(r.json(), key)
        for x in items:
            if not isinstance(x, dict):
                raise TypeError(f"a JSON {type(x).__name__} in the list of {key}, where an object goes")
            if missing := [k for k in keys if k not in x]:
                raise ValueError(f"an item of {key} with no {', '.join(missing)} field")
        return items
    return parse


def none(resp: httpx.Response) -> None:
    """The answer of a call the API answers 204 with no body: any other is not the API's
    (a proxy's catch-all ``200 {}`` read as a VM deleted, a host cordoned)."""
    if resp.status_code != 204 or resp.content:
        raise ValueError(f"expected 204 with no body, not {resp.status_code} with {len(resp.content)} bytes")
    return None


def undecodable(exc: Exception, call: Call) -> ApiError:
    """The ApiError of an answer whose body does not decode as its headers say."""
    return ApiError(0, INVALID_ANSWER, f"{call.method} {call.path} was answered with a body that does not decode "
                                       f"as its Content-Encoding says ({exc}): is the url a fuse controller?")


def where(base: str, uds: str | None) -> str:
    """The controller's address, as an error names it."""
    return f"unix://{uds}" if uds else base


def resolve_url(url: str | None) -> tuple[str, str | None]:
    """(base_url, unix socket path or None). No url: $FUSE_URL, else the
    controller's default owner-only socket."""
    if not url:
        url = os.environ.get("FUSE_URL", "")
    if not url:
        from ..controller.service import default_controller_socket
        from ..paths import socket_dir_problem
        sock = default_controller_socket()
        if why := socket_dir_problem(sock.parent):  # (the requests would go to whoever put a socket there)
            raise ValueError(f"the default controller socket {sock}: {why}")
        return "http://fuse", str(sock)
    if url.lower().startswith("unix://"):
        return "http://fuse", _unix_socket(url)
    if url.lower().startswith(("http://", "https://")):
        _check_http_url(url)
        return url.rstrip("/"), None
    raise ValueError(f"url {url!r} must be unix:///path or http(s)://host:port")


def _unix_socket(url: str) -> str:
    """The socket path of a controller's ``unix://`` url, read by the rules of a host's
    address (``transport.address``): the scheme in any case, trailing slashes dropped, and
    ``ValueError`` for no socket path (``unix:///``), a relative one (``unix://ctl.sock``,
    dialled from whatever the working directory is) or a query or fragment. Taken as written,
    ``unix:///run/c.sock/`` and ``unix:///`` were dialled and read as "controller unreachable",
    when it is the url that is wrong, and ``UNIX://`` was no url."""
    from ..transport.address import BadAddress, normalise_address  # (here: it loads the transports, ~45 ms)

    try:
        sock = normalise_address(url)[len("unix://"):]
    except BadAddress as exc:  # (its examples name an agent's socket: this is the controller's)
        raise ValueError(str(exc).replace("/agent.sock", "/controller.sock")) from None
    if "?" in sock or "#" in sock:  # (a host's socket path may hold them; a url's query was dialled as a file name)
        raise ValueError(f"url {url!r} has a query or fragment: give unix:///path/to/controller.sock")
    return sock


def _check_http_url(url: str) -> None:
    """``ValueError`` saying why ``url`` cannot be a controller's http(s) address (a port
    that is no port, a host that is no host): said where the client is made, not as
    httpx's traceback at the first call, nor as "unreachable" after dialling port 99999."""
    import httpx

    try:
        parsed = httpx.URL(url)
        port, host = parsed.port, parsed.host  # (.host decodes an xn-- name: IDNAError, a ValueError)
    except (httpx.InvalidURL, ValueError) as exc:
        raise ValueError(f"url {url!r} is not an http(s)://host:port address: {exc}") from None
    if not host:
        raise ValueError(f"url {url!r} names no host: http(s)://host:port")
    try:  # (what the resolver is given: a bare UnicodeError at the first call otherwise)
        host.encode("idna")
    except UnicodeError:
        raise ValueError(f"url {url!r} names no valid host: {host!r} has an empty label (two dots in a row, "
                         "a dot at its start) or one longer than 63 characters") from None
    if ":" in host and "%" in host:  # (an IPv6 zone id: httpx hands it to the resolver, "name not known")
        raise ValueError(f"url {url!r} has an IPv6 zone id ({host[host.index('%'):]}): not supported; give the "
                         "controller's address without one, or its name")
    if parsed.userinfo:  # (the HTTP library sends it as Basic auth in place of the bearer token)
        raise ValueError(f"url {parsed.copy_with(username=None, password=None)} carries a user or password: "
                         "give the controller's token as token=, not in the url")
    if "?" in url or "#" in url:  # (a query went before every path: ?x=1/v1/hosts)
        raise ValueError(f"url {url!r} has a query or fragment: give http(s)://host:port[/path]")
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"url {url!r} has port {port}: a port is 1-65535")


def proxy_for(base: str, uds: str | None) -> str | None:
    """The proxy a request to ``base`` goes through, as Go's tools (kubectl) choose it from the
    environment: ``HTTPS_PROXY`` for an https url, ``HTTP_PROXY`` for an http one (each also in
    lower case), unless ``NO_PROXY`` names the host; never for a unix socket or a loopback
    address (localhost, 127.0.0.0/8, ::1), as Go's ``ProxyFromEnvironment``. (httpx's own
    reading of the environment sent a controller on 127.0.0.1 to a proxy: a proxy in a
    shell's environment made a local controller "unreachable" (review 38).)"""
    if uds:
        return None
    url = httpx.URL(base)
    host = url.host.lower()
    if host == "localhost" or host.endswith(".localhost") or _loopback(host):
        return None
    proxy = _env("HTTPS_PROXY" if url.scheme == "https" else "HTTP_PROXY")
    if not proxy or _no_proxy(host, url.port or (443 if url.scheme == "https" else 80)):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"  # (Go's rule: a bare host:port is an http proxy)


def shown_proxy(proxy: str | None) -> str:
    """``proxy`` as an error may show it: without a user and password (a proxy's credentials in
    HTTP(S)_PROXY were printed in every error, the CLI's stderr and the MCP tool's answers)."""
    try:
        url = httpx.URL(proxy or "")
        shown = str(url.copy_with(username=None, password=None)) if url.userinfo else (proxy or "")
    except Exception:  # (not a url httpx reads)
        shown = proxy or ""
    return shown.rpartition("@")[2] if "@" in shown else shown


def _env(name: str) -> str:
    return os.environ.get(name) or os.environ.get(name.lower()) or ""


def _loopback(host: str) -> bool:
    import ipaddress
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _no_proxy(host: str, port: int) -> bool:
    """Whether ``NO_PROXY`` names ``host`` (Go's rules: ``*``; an IP address or a CIDR range;
    a domain, with or without a leading dot, matching itself and its subdomains; any of these
    with ``:port``, matching that port only)."""
    import ipaddress
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        ip = None
    for entry in (e.strip().lower() for e in _env("NO_PROXY").split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        try:
            net = ipaddress.ip_network(entry.strip("[]"), strict=False)
        except ValueError:
            net = None
        if net is not None:  # (an address or a range: matches addresses only, as Go's)
            if ip is not None and ip in net:
                return True
            continue
        name, _, want = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if want and want != str(port):
            continue
        name = name.strip("[]").lstrip("*").lstrip(".")
        if name and (host == name or host.endswith("." + name)):
            return True
    return False


def transport(uds: str | None, proxy: str | None, *, asynchronous: bool) -> Any:
    """A new httpx transport (a pool of its own) to the controller at ``uds``, or through
    ``proxy`` (``proxy_for``'s): the clients pass one, so httpx reads no proxy from the
    environment itself, while TLS still takes ``SSL_CERT_FILE``/``SSL_CERT_DIR`` as before."""
    cls = httpx.AsyncHTTPTransport if asynchronous else httpx.HTTPTransport
    if uds:
        return cls(uds=uds, limits=LIMITS)
    try:
        return cls(limits=LIMITS, proxy=proxy)
    except (ValueError, ImportError) as exc:  # (a proxy url httpx cannot use, socks without socksio: said here)
        raise ValueError(f"the proxy {shown_proxy(proxy)!r} from the environment (HTTP(S)_PROXY): {exc}") from None


def interrupt(transport: Any) -> None:
    """Shut down the sockets of ``transport``'s connections, those in use too: closing a socket
    does not wake a thread blocked reading it (a sync ``events.follow`` in its long poll waited
    out its ``wait_s`` after ``close()``), shutting it down does. Best effort: it reaches into
    httpcore's pool, and does nothing where that is not as it was written for (httpcore 1.0)."""
    import socket

    for conn in getattr(getattr(transport, "_pool", None), "connections", ()):
        stream = getattr(getattr(conn, "_connection", None), "_network_stream", None)
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # (already closed, or never connected)
                pass


def headers(token: str | None) -> dict[str, str]:
    """The controller token's header; ``ValueError`` (not quoting it) for a token no
    header can hold (``fuse.tokens``), where the HTTP library's error quoted it."""
    from ..tokens import token_problem

    token = token if token is not None else os.environ.get("FUSE_TOKEN")
    if why := token_problem(token):
        raise ValueError(f"the controller token {why}")
    return {"Authorization": f"Bearer {token}"} if token else {}
