"""Map the fuse error tree (and FastAPI's own validation errors) onto the
wire envelope `{"error": {"code", "message"}}`."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .errors import FuseError, error_body

_STATUS_CODES = {400: "invalid_argument", 401: "unauthorized", 403: "forbidden", 404: "not_found",
                 405: "method_not_allowed", 409: "conflict", 502: "host_unreachable"}


def install(app: FastAPI) -> None:
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
        code = _STATUS_CODES.get(exc.status_code, "internal" if exc.status_code >= 500 else "error")
        return JSONResponse(error_body(code, str(exc.detail)), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))
