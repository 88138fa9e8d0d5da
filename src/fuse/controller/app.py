"""The controller's REST API (OpenAPI 3 at /openapi.json). Routes turn
requests into service calls; they never touch the store or a host."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import copy
import re
import threading
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from sqlalchemy.exc import DBAPIError

from .. import http_errors
from ..errors import error_body
from ..auth import BearerFirst
from ..models.errors import ErrorBody, bearer_scheme, close_request_objects, document_400_not_422
from .routes import controller as controller_routes
from .routes import events as event_routes
from .routes import hosts as host_routes
from .routes import moves as move_routes
from .routes import pool as pool_routes
from .routes import usage as usage_routes
from .routes import vms as vm_routes
from .pool.planner import warm as warm_planner
from .service import Controller
from .store import DB_LOCK_TIMEOUT_S
from .store.outage import db_busy, db_unreachable  # (here too: its older home)
from .validation import install as install_validation
from .validation import MAX_BODY_BYTES, LimitBody, RefuseBadPath, ServeHead, reject_unknown_fields, reject_unknown_query

# Paths served without the token on the TCP listener; the middleware and the
# OpenAPI document both read this, so what is documented is what is enforced.
OPEN_PATHS = ("/v1/healthz",)


HEALTH_DB_SECS = 5.0  # the health check's wait for the database's answer
log = logging.getLogger("fuse.controller")

# What every route does beside its own statuses, said once (review 38: a client generated
# from the document, or a tool checking answers against it, met these unannounced).
DESCRIPTION = (
    "Places VMs across hosts by best fit, moves them, merges events and usage, and runs the elastic pool.\n\n"
    "Every route: a method its path does not take is `405 method_not_allowed`, its `Allow` header naming the "
    "methods the path takes; `HEAD` is served wherever `GET` is (the same status and headers, no body). A path "
    "no route takes is `404 no_route` (`404 not_found` is a route's: no such host, VM, move...). A path or "
    "query holding a control character, or percent-escapes that are not UTF-8, is `400 invalid_argument`. A "
    f"request body over {MAX_BODY_BYTES // 2**20} MiB is `413`, whatever the route (listed on each). Integer "
    "fields of a JSON body take JSON integers only: `1.0`, `true` and `\"1\"` are `400 invalid_argument`, "
    "though JSON Schema counts `1.0` as an integer.")


class Health(BaseModel):
    status: Literal["ok"]


def operation_id(route: APIRoute) -> str:
    """verb+Noun operation ids: the `createVm:` that opens a route's summary, else its function name in camelCase."""
    m = re.match(r"([a-z]+[A-Za-z0-9]*):", route.summary or "")
    if m:
        return m.group(1)
    head, *rest = route.name.split("_")
    return head + "".join(w.capitalize() for w in rest)


def document_strict_bodies(doc: dict[str, Any]) -> dict[str, Any]:
    """Say what the app does with request bodies: an unknown field, at any depth, is
    400 (``reject_unknown_fields``). Every object schema only request bodies use gets
    ``additionalProperties: false`` (one an answer uses too stays open: a newer server may
    add fields to an answer). ``POST /v1/hosts`` takes seed 000's register form or seed
    004's short ``{name, addr}`` form of the same record: both are documented."""
    from ..models.hosts import RegisterHostRequest

    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    register = RegisterHostRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, sub in register.pop("$defs", {}).items():
        schemas.setdefault(name, sub)
    schemas["RegisterHostRequest"] = register
    short = copy.deepcopy(register)
    props = short["properties"]
    props["name"] = dict(props.pop("id"), title="Name", description="The host's id (seed 004's name for id).")
    props["addr"] = dict(props.pop("url"), title="Addr", description="The agent's address (seed 004's name for url).")
    short["required"] = ["name", "addr"]
    short["title"] = "AddHostRequest"
    short["description"] = ("Seed 004's `hosts add`: id as `name`, url as `addr`; a missing capacity.vm_count is 16 "
                            "and a missing backend the one the agent runs.")
    schemas["AddHostRequest"] = short
    op = doc.get("paths", {}).get("/v1/hosts", {}).get("post")
    if op is not None:
        op["requestBody"]["content"]["application/json"]["schema"] = {"oneOf": [
            {"$ref": "#/components/schemas/RegisterHostRequest"}, {"$ref": "#/components/schemas/AddHostRequest"}]}
    return close_request_objects(doc)


def document_every_route(doc: dict[str, Any]) -> dict[str, Any]:
    """What the app does before any route, and what services check in their own words, said
    in the document (review 38). ``LimitBody`` answers 413 to a body over the limit on every
    route, one that takes no body included. A create's ``entry`` and a move's names are
    checked by their services, whose messages a schema constraint checked first would
    replace: their limits are stated here (a key the model states itself is left as it is)."""
    from ..models.vm import MAX_ENTRY_BYTES

    envelope = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    for ops in doc.get("paths", {}).values():
        for op in ops.values():
            op.setdefault("responses", {}).setdefault("413", {
                "description": f"invalid_argument: the request body is over {MAX_BODY_BYTES // 2**20} MiB",
                "content": envelope})
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    if (create := schemas.get("ControllerCreateVm")) is not None:
        # (a create here is never standby: the route refuses one, so the entry is always required)
        props = create["properties"]
        entry = dict(_text(props["entry"]))  # (null is refused as missing: the string alone)
        entry.setdefault("maxLength", MAX_ENTRY_BYTES)
        props["entry"] = entry | {"title": "Entry", "description": (
            f"The command the VM runs: at most {MAX_ENTRY_BYTES} bytes of UTF-8, as the host holds it "
            "(maxLength counts characters, and a character may take several bytes), with no NUL. "
            "Required here; only a standby VM is created without one, and standby VMs are kept by prewarms.")}
        create["required"] = sorted(set(create.get("required", [])) | {"entry"})
        props["standby"] |= {"enum": [False], "description": "Only false here: standby VMs are kept by prewarms "
                                                              "(POST /v1/prewarms); true is 400."}
    if (move := schemas.get("MoveRequest")) is not None:
        for name in ("vm", "flashvm", "to", "host"):  # (blank is refused too: MoveRequest says so)
            _text(move["properties"][name]).setdefault("minLength", 1)
    return doc


def _text(prop: dict[str, Any]) -> dict[str, Any]:
    """The string branch of an optional string property's schema (``anyOf: [string, null]``)."""
    return next((s for s in prop.get("anyOf", []) if s.get("type") == "string"), prop)


def document_bearer(doc: dict[str, Any]) -> dict[str, Any]:
    """The controller's token as the document's bearer scheme. The owner-only unix socket
    needs no token, which OpenAPI cannot say per transport: the scheme's description does."""
    return bearer_scheme(doc, "The controller's token (`fuse controller serve --listen HOST:PORT --token TOKEN`): "
                              "required on its TCP listener by every route but the health check; requests over "
                              "its owner-only unix socket need none.", OPEN_PATHS,
                        refused="over TCP, no `Authorization: Bearer <token>` or another token")


def create_app(ctl: Controller) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await ctl.start()
        # the planner's solver libraries load in the background (~1 s), not in the first plan's time limit
        if os.environ.get("FUSE_PLANNER_WARM", "1") != "0":
            threading.Thread(target=warm_planner, name="fuse-planner-warm", daemon=True).start()
        try:
            yield
        finally:
            await ctl.close()

    # The OpenAPI document and docs pages are served by our own routes below,
    # behind the same token as the API (FastAPI's built-ins would be open).
    app = FastAPI(title="fuse controller", version="0.1.0", lifespan=lifespan,
                  generate_unique_id_function=operation_id,
                  openapi_url=None, docs_url=None, redoc_url=None,
                  dependencies=[Depends(reject_unknown_fields), Depends(reject_unknown_query)],  # known fields/params only
                  description=DESCRIPTION)
    # A path with an empty segment (`/v1/prewarms/` for an id of "") names nothing:
    # 404, not a redirect to the collection that a client would take for success.
    app.router.redirect_slashes = False
    http_errors.install(app)
    install_validation(app)  # after http_errors: its message for a bad request replaces the shared one
    app.add_middleware(RefuseBadPath)  # (added first: the token is checked before it)
    app.add_middleware(LimitBody)  # (after the token: an unauthorised caller is told 401, not 413)
    app.add_middleware(BearerFirst, token=ctl.token, open=OPEN_PATHS)  # every other route needs it
    app.add_middleware(ServeHead)  # (last: everything inside sees the GET it is served as)
    app.state.ctl = ctl
    app.state.stopping = ctl.events.stop_waiting  # (fuse.serving: a long poll answers at once on a stop)
    app.state.pool_snapshot = ctl.pool_snapshot

    @app.exception_handler(DBAPIError)
    async def _db_down(request: Request, exc: DBAPIError):
        # (a lost connection, a restarting server: 503, which a load balancer takes
        # out of rotation, not 500 internal; the driver's words stay in the log)
        if not db_unreachable(exc):
            raise exc  # (a statement that failed is a bug: 500 internal, its traceback logged)
        if db_busy(exc):
            log.warning("%s %s: the database is busy: %s", request.method, request.url.path,
                        " ".join(str(exc.orig or exc).split()))
            return JSONResponse(error_body("db_unavailable", f"the controller's database is busy: a statement "
                                           f"waited {DB_LOCK_TIMEOUT_S:g} s for a lock another transaction holds "
                                           "(another controller replica's write); try again"), status_code=503)
        log.warning("%s %s: the database did not answer: %s", request.method, request.url.path,
                    " ".join(str(exc.orig or exc).split()))
        return JSONResponse(error_body("db_unavailable", f"the controller cannot reach its database "
                                       f"({type(exc.orig or exc).__name__}); try again"), status_code=503)

    @app.get("/v1/healthz", summary="Liveness check (no token needed): 503 db_unavailable when the "
             "controller cannot reach its database.", tags=["controller"],
             response_model=Health,
             responses={503: {"model": ErrorBody, "description": "The controller cannot reach its database."}})
    async def healthz():
        try:
            await asyncio.wait_for(asyncio.to_thread(ctl.store.ping), HEALTH_DB_SECS)
        except Exception as exc:
            why = "did not answer in time" if isinstance(exc, (TimeoutError, asyncio.TimeoutError)) else \
                type(getattr(exc, "orig", None) or exc).__name__
            return JSONResponse(error_body("db_unavailable", f"the controller cannot reach its database ({why})"),
                                status_code=503)
        return {"status": "ok"}

    from fastapi.openapi.docs import get_swagger_ui_html

    plain_openapi = app.openapi

    def documented() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = document_bearer(document_strict_bodies(document_every_route(
                document_400_not_422(plain_openapi()))))
        return app.openapi_schema

    app.openapi = documented  # type: ignore[method-assign]

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi() -> dict:
        return app.openapi()

    @app.get("/docs", include_in_schema=False)
    async def docs():
        return get_swagger_ui_html(openapi_url="/openapi.json", title="fuse controller")

    app.include_router(host_routes.router)
    app.include_router(controller_routes.router)
    for routes in (vm_routes, event_routes, usage_routes, move_routes, pool_routes):
        app.include_router(routes.router)
    return app
