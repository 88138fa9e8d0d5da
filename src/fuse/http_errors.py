"""Map the fuse error tree (and FastAPI's own validation errors) onto the
wire envelope `{"error": {"code", "message"}}`.

Anything else a route raises is a bug: it answers 500 ``internal`` in the
same envelope (never Starlette's text/plain "Internal Server Error"), and its
traceback goes to the ``fuse.http`` log once. A client that hangs up before its
request's body came whole is no bug: one line in the log, and no answer (nobody
is there to read it).
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from .errors import FuseError, error_body

log = logging.getLogger("fuse.http")

_STATUS_CODES = {400: "invalid_argument", 401: "unauthorized", 403: "forbidden", 404: "not_found",
                 405: "method_not_allowed", 409: "conflict", 502: "host_unreachable"}
NO_ROUTE = "no_route"  # the code of a 404 for a path no route takes (``not_found`` is a resource's)


class CatchAll:
    """ASGI middleware answering an unhandled exception with 500 ``internal``.

    It sits inside Starlette's ServerErrorMiddleware rather than being an
    ``exception_handler(Exception)``: that one re-raises after answering, so
    the server would log the traceback a second time. An exception after the
    response has started cannot be answered any more and goes on up."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except ClientDisconnect:
            # (a move's chunk cut off mid-upload, a client killed: logged as an internal error
            # with its traceback, and a 500 written to nobody)
            log.info("%s %s: the client hung up before its request's body came whole", scope.get("method", ""),
                     scope.get("path", ""))
        except Exception as exc:
            if started:
                raise
            log.exception("unhandled error in %s %s", scope.get("method", ""), scope.get("path", ""))
            resp = JSONResponse(error_body("internal", f"internal error ({type(exc).__name__}); the server's log "
                                                       "has the details"), status_code=500)
            await resp(scope, receive, send)


def install(app: FastAPI) -> None:
    app.add_middleware(CatchAll)

    @app.exception_handler(FuseError)
    async def _fuse(request: Request, exc: FuseError):
        return JSONResponse(exc.body(), status_code=exc.http_status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        msg = f"{where}: {first.get('msg', 'invalid')}" if where else first.get("msg", "invalid request")
        return JSONResponse(error_body("invalid_argument", msg), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        status = exc.status_code
        code = _STATUS_CODES.get(status, "internal" if status >= 500 else "error")
        detail = str(exc.detail)
        path = request.url.path
        if status == 404 and request.method == "PUT" and _slashed_id(request, request.method):
            # a PUT names what it creates (`PUT /v1/pool/clouds/a%2Fb`): a name that cannot be is the
            # request's fault, invalid_argument as any other bad name, not a thing found missing
            status, code = 400, "invalid_argument"
            detail = f"{path}: the name it gives holds a '/', which no name here may: give one without it"
        elif status == 404 and _empty_id(request):  # an empty id (`/v1/prewarms/` for a prewarm
            detail = f"{path}: an empty id names nothing"  # ""): no such resource, not_found
        elif status == 404 and _slashed_id(request):  # `/v1/vms/a%2Fb`: no VM is named so
            detail = f"{path}: no such resource (its name holds a '/', which no name here does)"
        elif status == 404:  # the router's: no such route, not a resource missing (a client
            # given another server's url, or one with a path prefix, read its hosts and VMs as gone)
            code, detail = NO_ROUTE, (f"no route {request.method} {request.url.path} here: is the url this "
                                      "server's (a controller's, an agent's), with no path of its own?")
        elif status == 400 and detail == "There was an error parsing the body":  # (FastAPI's words)
            detail = ("the request body could not be read as JSON: send UTF-8 JSON with no Content-Encoding, "
                      "nested at most a few hundred levels, its integers at most 4,300 digits long")
        headers = getattr(exc, "headers", None)
        if status == 405:  # Allow: every method the path takes, not the first route's alone
            headers = {**(headers or {}), "Allow": ", ".join(_methods(request))}
        return JSONResponse(error_body(code, detail), status_code=status, headers=headers)


def _empty_id(request: Request) -> bool:
    """Whether the path is a route's with an id left empty (`/v1/vms/`, `/v1/vms//sleep`): with
    each empty part filled in, some route takes it (`/v1/nosuch/` stays a route there is not)."""
    path = request.scope.get("path", "")
    filled = re.sub(r"/(?=/|$)", "/x", path)
    return filled != path and _routed(request, filled)


def _slashed_id(request: Request, method: str = "") -> bool:
    """Whether the path is a route's with an id that holds an encoded '/' (`/v1/vms/a%2Fb`):
    with each such id made one part, some route takes it (by ``method``, when given)."""
    raw = request.scope.get("raw_path") or b""
    return b"%2f" in raw.lower() and _routed(request, unquote(re.sub(r"%2[fF]", "x", raw.decode("latin-1"))),
                                             method)


def _routed(request: Request, path: str, method: str = "") -> bool:
    """Whether some route of the app takes ``path`` (by ``method``, when given; else any)."""
    scope = {**request.scope, "path": path} | ({"method": method} if method else {})
    return any(r.matches(scope)[0] == Match.FULL if method else r.matches(scope)[0] != Match.NONE
               for r in request.app.routes)


def _methods(request: Request) -> list[str]:
    """The methods some route takes at the request's path (Starlette's 405 names one route's)."""
    return [m for m in ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")
            if any(r.matches({**request.scope, "method": m})[0] == Match.FULL for r in request.app.routes)]
