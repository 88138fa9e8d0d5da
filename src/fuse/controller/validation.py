"""How the controller's API reads a request body, and words what is wrong with one.

A body is a JSON object sent with ``Content-Type: application/json``. Any
other content type is refused (400 ``invalid_argument``, saying so), as
Docker's API does: guessing JSON out of a form post or ``text/plain`` would
also let a web page's cross-site form reach a token-less loopback listener.

A body may name only fields the API knows, at any depth: a misspelt optional
field (``hosts`` for ``host``) is a 400 naming it, never a default quietly
taken in its place. Firecracker's API is as strict. The wire records stay
lenient themselves (``Record``: the SDK must read answers from newer
servers); the check is the server's, on the way in.

Every validation failure is one 400 ``invalid_argument`` whose message names
fields the way the caller spelt them: ``missing fields shape, entry``,
``unknown field hosts (did you mean host?)``, ``shape.vcpus: Input should be
greater than or equal to 1``.
"""

from __future__ import annotations

import difflib
import email.message
import json
import re
import types
from collections import Counter
from typing import Annotated, Any, Iterable, Optional, Union, get_args, get_origin
from urllib.parse import unquote_to_bytes

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import AliasChoices, AliasPath, BaseModel, TypeAdapter, ValidationError

from ..errors import error_body

JSON_HINT = "send the body as JSON with Content-Type: application/json"
MAX_PROBLEMS = 5  # named in one message; the rest are counted


# ---- unknown fields ------------------------------------------------------------

def _keys(model: type[BaseModel], name: str, field) -> list[str]:
    """The keys a caller may spell `field` with: its aliases, and its own name
    where the model populates by name (or has no alias)."""
    keys: list[str] = []
    for alias in (field.alias, field.validation_alias):
        choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
        for c in choices:
            if isinstance(c, str):
                keys.append(c)
            elif isinstance(c, AliasPath) and c.path and isinstance(c.path[0], str):
                keys.append(c.path[0])
    cfg = model.model_config
    if not keys or cfg.get("populate_by_name") or cfg.get("validate_by_name"):
        keys.append(name)
    return keys


def unknown_fields(annotation: Any, value: Any, loc: tuple = ()) -> list[dict[str, Any]]:
    """Errors in pydantic's shape (type ``extra_forbidden``) for every key of
    `value` that `annotation` has no field for, at any depth. A model that sets
    ``extra`` itself is left to it at its own level (``forbid``: pydantic
    reports; ``allow``: extras wanted) and only looked into."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return unknown_fields(get_args(annotation)[0], value, loc)
    if origin in (Union, types.UnionType):
        # Optional[Model] is the common case; with several models pydantic
        # picks one by the data, and which one is not ours to guess.
        models = [a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        return unknown_fields(models[0], value, loc) if len(models) == 1 else []
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if not isinstance(value, dict):
            return []
        known: dict[str, Any] = {}
        for name, field in annotation.model_fields.items():
            known |= dict.fromkeys(_keys(annotation, name, field), field.annotation)
        out = []
        if annotation.model_config.get("extra") in (None, "ignore"):
            for key, v in value.items():
                if key not in known:
                    near = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
                    out.append({"type": "extra_forbidden", "loc": loc + (key,), "msg": "Extra inputs are not "
                                "permitted", "input": v, "ctx": {"did_you_mean": near[0]} if near else {}})
        for key, v in value.items():
            if key in known:
                out += unknown_fields(known[key], v, loc + (key,))
        return out
    args = get_args(annotation)
    if origin in (list, set, frozenset, tuple) and isinstance(value, list) and args:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return []  # a fixed tuple of several types: none here
        return [e for i, v in enumerate(value) for e in unknown_fields(args[0], v, loc + (i,))]
    if origin is dict and isinstance(value, dict) and len(args) == 2:
        return [e for k, v in value.items() for e in unknown_fields(args[1], v, loc + (k,))]
    return []


def _is_json(content_type: Optional[str]) -> bool:
    """What FastAPI parses as JSON: application/json or application/*+json."""
    if not content_type:
        return False
    m = email.message.Message()
    m["content-type"] = content_type
    sub = m.get_content_subtype()
    return m.get_content_maintype() == "application" and (sub == "json" or sub.endswith("+json"))


def not_text(value: Any, loc: tuple = ()) -> list[dict[str, Any]]:
    """Errors in pydantic's shape for every string of `value` (key or value, at any
    depth) that holds a lone UTF-16 surrogate: JSON's ``"\\udfff"`` escape parses
    to one, which no UTF-8 text holds, so it could be neither stored nor answered
    (a host registered with one in a label was kept, then every host list was a 500)."""
    def bad(text: str) -> bool:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False

    out: list[dict[str, Any]] = []
    if isinstance(value, str):
        if bad(value):
            out.append({"type": "string_unicode", "loc": loc, "input": value.encode("utf-8", "backslashreplace")
                        .decode(), "msg": "holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape that is half of "
                        "a pair): not Unicode text"})
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and bad(k):
                out.append({"type": "string_unicode", "loc": loc, "input": None,
                            "msg": f"the key {k.encode('utf-8', 'backslashreplace').decode()} holds a lone "
                                   "UTF-16 surrogate: not Unicode text"})
            else:
                out += not_text(v, loc + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += not_text(v, loc + (i,))
    return out


async def reject_unknown_fields(request: Request) -> None:
    """App-wide dependency: a JSON body naming a field its route's model lacks
    is refused, with every other problem of the body in the same answer; so is
    a body holding a string that is not Unicode text (``not_text``), before
    anything reads it. (FastAPI has parsed the body by now; it answers bad JSON itself.)"""
    field = getattr(request.scope.get("route"), "body_field", None)
    if field is None or not _is_json(request.headers.get("content-type")) or not await request.body():
        return
    try:
        value = await request.json()
    except ValueError:
        return
    if broken := not_text(value, ("body",)):
        raise RequestValidationError(broken)
    if twice := duplicate_keys(await request.body()):
        raise RequestValidationError(twice)
    annotation = field.field_info.annotation
    extras = unknown_fields(annotation, value, ("body",))
    if not extras:
        return
    try:
        TypeAdapter(annotation).validate_python(value)
        others: list[dict[str, Any]] = []
    except ValidationError as exc:
        others = [e | {"loc": ("body", *e["loc"])} for e in exc.errors()]
    raise RequestValidationError(extras + others, body=value)


def duplicate_keys(raw: bytes) -> list[dict[str, Any]]:
    """A JSON object naming a key twice (``{"entry": "x", "entry": "y"}``): the parser keeps
    the last, so the caller's first is dropped without a word; refused instead."""
    seen: list[dict[str, Any]] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        counts = Counter(k for k, _ in items)  # (linear: a count per key made one body of
        # 20,000 keys hold the event loop for seconds, and a 16 MiB one for hours)
        for k in (k for k, n in counts.items() if n > 1):
            seen.append({"type": "value_error", "loc": ("body", k), "input": None,
                         "msg": "appears twice in one JSON object: give it once"})
        return dict(items)

    try:
        json.loads(raw, object_pairs_hook=pairs)
    except ValueError:
        return []
    return seen


async def reject_unknown_query(request: Request) -> None:
    """App-wide dependency: a query parameter its route does not take is refused
    (400, naming it), never quietly ignored: ``?hosts=a`` for ``?host=a`` would
    otherwise answer every host's records as if filtered."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None or not request.query_params:
        return
    known: set[str] = set()
    todo = [dependant]
    while todo:  # the route's own parameters and its dependencies'
        d = todo.pop()
        known |= {p.alias for p in d.query_params}
        todo += d.dependencies
    extras = []
    for key in dict.fromkeys(request.query_params.keys()):
        if key in known and len(given := request.query_params.getlist(key)) > 1:
            # (one value a parameter: the last was taken, the others dropped without a word)
            extras.append({"type": "value_error", "loc": ("query", key), "input": given,
                           "msg": f"given {len(given)} times ({', '.join(given)}): give it once"})
        if key not in known:
            near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
            extras.append({"type": "extra_forbidden", "loc": ("query", key), "msg": "Extra inputs are not permitted",
                           "input": request.query_params[key], "ctx": {"did_you_mean": near[0]} if near else {}})
    if extras:
        raise RequestValidationError(extras)


# ---- messages ------------------------------------------------------------------

def _where(loc: Iterable[Any]) -> tuple[str, str]:
    """(``body``/``query``/``path``/``header``/``cookie``, the name as the caller
    spelt it): ``("body", "files", 0, "name")`` → ``("body", "files[0].name")``."""
    kind, *rest = list(loc) or ["body"]
    name = ""
    for part in rest:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return str(kind), name


def _json_type(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


def _whole_body(error: dict[str, Any], body: Any, content_type: Optional[str]) -> str:
    """The message for a body that failed as a whole (not one of its fields)."""
    if isinstance(body, (bytes, bytearray)):  # FastAPI left it unparsed: it was not sent as JSON
        got = f"it came as {content_type}" if content_type else "it came with no Content-Type"
        return f"the body is not JSON ({got}): {JSON_HINT}"
    if error["type"] == "missing":
        return "the body is empty: send a JSON object with Content-Type: application/json"
    if error["type"] in ("model_attributes_type", "model_type", "dict_type"):
        return f"the body must be a JSON object, not {_json_type(body)}"
    return _plain(error["msg"])


def _plain(msg: str) -> str:
    return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")


def describe(errors: list[dict[str, Any]], body: Any = None, content_type: Optional[str] = None) -> str:
    """One message for a request's validation errors: unknown fields first
    (they often explain the missing ones), then missing fields, then the rest."""
    for e in errors:
        if e["type"] == "json_invalid":  # loc ("body", offset); the body is the text
            text, at = body if isinstance(body, str) else "", e["loc"][-1]
            if isinstance(at, int) and text:
                line = text.count("\n", 0, at) + 1
                col = at - (text.rfind("\n", 0, at) + 1) + 1
                return f"the body is not valid JSON: {e.get('ctx', {}).get('error', 'decode error')} " \
                       f"at line {line} column {col}"
            return "the body is not valid JSON"
    whole = [e for e in errors if tuple(e["loc"]) == ("body",) and e["type"] != "value_error"]
    if whole:
        return _whole_body(whole[0], body, content_type)
    first, missing, rest = [], [], []  # first: the unknown fields, then (below) the missing ones
    for e in errors:
        kind, name = _where(e["loc"])
        msg = _plain(e["msg"])
        if e["type"] == "extra_forbidden":
            near = (e.get("ctx") or {}).get("did_you_mean")
            what = "query parameter" if kind == "query" else "field"
            first.append(f"unknown {what} {name}" + (f" (did you mean {near}?)" if near else ""))
        elif kind == "body":
            if e["type"] == "missing":
                missing.append(name)
            else:
                rest.append(f"{name}: {msg}" if name else msg)
        else:
            what = f"header {name}" if kind == "header" else f"{kind} parameter {name}"
            rest.append(f"missing {what}" if e["type"] == "missing" else f"{what}: {msg}")
    if missing:
        first.append(("missing field " if len(missing) == 1 else "missing fields ") + ", ".join(missing))
    problems = first + rest or ["invalid request"]
    more = len(problems) - MAX_PROBLEMS
    return "; ".join(problems[:MAX_PROBLEMS]) + (f"; and {more} more" if more > 0 else "")


def install(app: FastAPI) -> None:
    """Answer request-validation errors with `describe`'s message. Registered
    after ``fuse.http_errors.install``, it replaces that one's terser
    handler for this app (FastAPI keeps one handler per exception class)."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        msg = describe(list(exc.errors()), exc.body, request.headers.get("content-type"))
        return JSONResponse(error_body("invalid_argument", msg), status_code=400)


# ---- paths ---------------------------------------------------------------------

MAX_BODY_BYTES = 16 * 1024 * 1024  # far past any request of the API (an edited plan model included)


class LimitBody:
    """413 ``invalid_argument`` for a request body over ``MAX_BODY_BYTES``: by its
    Content-Length before it is read, else (chunked) once that much has come. Without it a
    200 MiB body was read whole into the controller's memory, and kept its memory grown."""

    def __init__(self, app, limit: int = MAX_BODY_BYTES, larger: dict[str, int] | None = None) -> None:
        """``larger``: a higher limit for the paths a pattern fully matches (the agent's raw
        file chunks)."""
        self.app, self.limit = app, limit
        self.larger = [(re.compile(pattern), n) for pattern, n in (larger or {}).items()]

    def _limit(self, scope) -> int:
        path = scope.get("path", "")
        return next((n for pattern, n in self.larger if pattern.fullmatch(path)), self.limit)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self._limit(scope)
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        if length.isdigit() and int(length) > limit:
            await self._refuse(scope, receive, send, int(length), limit)
            return
        seen, over = 0, False

        async def limited():
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:  # the app is told the client left: it acts on nothing
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def unless_over(message) -> None:
            if not over:  # (the app's own answer to a body cut short is not the one sent)
                await send(message)
        await self.app(scope, limited, unless_over)
        if over:
            await self._refuse(scope, receive, send, None, limit)  # (read up to past the limit: its size unknown)

    @staticmethod
    async def _refuse(scope, receive, send, size: int | None, limit: int) -> None:
        said = f"over {limit} bytes" if size is None else f"{'over ' if size <= limit else ''}{size} bytes"
        await JSONResponse(error_body("invalid_argument", f"the request body is {said}: at most {limit} are read"),
                           status_code=413, headers={"Connection": "close"})(scope, receive, send)


class RefuseBadPath:
    """400 ``invalid_argument`` for a path that names nothing here, whatever route it looks
    like: one holding a control character (``%00``…``%1F``, ``%7F``) or percent-escapes
    that are not UTF-8. No host, VM or move name holds either (host ids refuse control
    characters, VM and move names are a plain alphabet), and each was worse than a 404:
    PostgreSQL refuses to compare text with a NUL (a 500 on a lookup the embedded store
    answered 404); a trailing ``%0A`` matched the route of the id without it (``$`` matches
    before a final newline: a DELETE of ``/v1/hosts/x%0A`` removed host ``x``); escapes
    that are not UTF-8 were decoded to U+FFFD, the id of another host. The query too
    (review 34: ``?host=%ff`` named host U+FFFD): no parameter takes free text."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and (why := path_problem(scope)):
            await JSONResponse(error_body("invalid_argument", f"the path {why}: no name here holds one"),
                               status_code=400)(scope, receive, send)
            return
        if scope["type"] == "http" and (why := query_problem(scope)):
            await JSONResponse(error_body("invalid_argument", f"the query {why}: no parameter here takes one"),
                               status_code=400)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def path_problem(scope) -> str | None:
    """Why a request's path names nothing (``RefuseBadPath``), or None."""
    path = scope.get("path", "")
    if "\x00" in path:
        return "contains a NUL character (%00)"
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path):
        return "contains a control character"
    raw = scope.get("raw_path")
    if raw is not None:
        try:
            unquote_to_bytes(raw.split(b"?", 1)[0]).decode("utf-8")
        except UnicodeDecodeError:
            return "holds percent-escapes that are not UTF-8"
    return None


def query_problem(scope) -> str | None:
    """Why a request's query string holds what no parameter takes (``RefuseBadPath``), or None."""
    for part in (scope.get("query_string") or b"").split(b"&"):
        try:
            text = unquote_to_bytes(part.replace(b"+", b" ")).decode("utf-8")
        except UnicodeDecodeError:
            return "holds percent-escapes that are not UTF-8"
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
            return "contains a control character" if "\x00" not in text else "contains a NUL character (%00)"
    return None


class ServeHead:
    """HEAD wherever GET is served (RFC 9110 section 9.3.2; a load balancer's health check
    may send it): the request goes through as a GET, its answer with its status and headers
    (Content-Length included) and no body. Elsewhere it is 405, as any method a path does not
    take, and a 405's ``Allow`` names HEAD beside GET. One rule for the app, not a HEAD route
    beside each GET one, which the document would list twice."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        head = scope["method"] == "HEAD"

        async def sending(message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 405:
                message = {**message, "headers": [(k, _with_head(v) if k.lower() == b"allow" else v)
                                                  for k, v in message.get("headers", [])]}
            elif head and message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)
        await self.app({**scope, "method": "GET"} if head else scope, receive, sending)


def _with_head(allow: bytes) -> bytes:
    """An ``Allow`` value with HEAD after GET (``ServeHead`` serves it; no route names it)."""
    methods = [m.strip() for m in allow.split(b",") if m.strip()]
    if b"GET" in methods and b"HEAD" not in methods:
        methods.insert(methods.index(b"GET") + 1, b"HEAD")
    return b", ".join(methods)
