"""The error envelope every API answers with, for the OpenAPI document.

``{"error": {"code": "...", "message": "...", ...details, "details": {...}}}`` (built by
``fuse.errors.error_body``). Routes list their statuses and codes with
``responses(...)``; the app documents every request-validation failure as
the 400 it is (``invalid_argument``), never FastAPI's default 422.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field


class ErrorDetail(BaseModel):
    """The error's code and one-sentence message; some codes add details
    (``hosts`` on ``fleet_full``, ``ambiguous_vm`` and a best-fit move's
    ``no_target``), both beside ``code`` and under ``details``."""

    model_config = ConfigDict(extra="allow")

    code: str
    message: str
    details: Optional[dict[str, Any]] = Field(
        default=None, description="the code's extras (the same keys as beside code); absent when it has none")


class ErrorBody(BaseModel):
    """``{"error": {"code", "message", ...}}``: every error the API answers."""

    error: ErrorDetail


def responses(**by_status: str) -> dict[int | str, dict[str, Any]]:
    """FastAPI ``responses=`` for error statuses: ``responses(s409="not_movable, ...")``."""
    return {int(k.lstrip("s")): {"model": ErrorBody, "description": v} for k, v in by_status.items()}


# Every controller route reads its store, so each answers 503 when the database is away
# (README: "every route"): its routers declare it for all their routes (``STORE_ROUTES``),
# and a route whose host may have done its work first says so in its own 503 (``db_done``).
DB_AWAY = ("the controller cannot reach its database (a connection lost, refused or not answered), or a "
           "statement waited for a lock another replica holds (the database is busy): try again (GET /v1/healthz "
           "answers 200 once the database is back)")
STORE_ROUTES = responses(s503=f"db_unavailable: {DB_AWAY}")


def db_done(details: str, did: str, shows: str) -> str:
    """The 503 of a route whose host may have carried it out before the database went away:
    ``details`` names the error's details, ``did`` what the host did, ``shows`` the VM list after."""
    return (f"db_unavailable: with error.details {details}, the host {did} but the controller could not record "
            f"it: do not ask again (the VM list {shows} once the database answers); without details, {DB_AWAY}")


def document_400_not_422(doc: dict[str, Any]) -> dict[str, Any]:
    """Rewrite an OpenAPI document so request-validation errors read as the
    app answers them: 400 with the error envelope (FastAPI documents 422)."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for model in (ErrorDetail, ErrorBody):
        schemas.setdefault(model.__name__, model.model_json_schema(ref_template="#/components/schemas/{model}"))
    envelope = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    for ops in doc.get("paths", {}).values():
        for op in ops.values():
            rs = op.setdefault("responses", {})
            rs.pop("422", None)
            # every route refuses a query parameter it does not take (GETs with none included)
            rs.setdefault("400", {"description": "invalid_argument: the request does not parse, a value is out "
                                                 "of range, or a query parameter the route does not take",
                                  "content": envelope})
            if "requestBody" in op:  # (the body limit is the server's, before the route: README)
                rs.setdefault("413", {"description": "invalid_argument: the request body is over 16 MiB",
                                      "content": envelope})
            rs.setdefault("500", {"description": "internal: an unexpected failure (the server's log has the "
                                                 "details); where a host failed, its own code passes through "
                                                 "(sleep_failed, say)", "content": envelope})
    return doc


def _refs(node: Any) -> set[str]:
    """The component schemas ``node`` refers to, directly."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        out = {ref.rsplit("/", 1)[-1]} if isinstance(ref, str) else set()
        return out.union(*(_refs(v) for k, v in node.items() if k != "$ref"))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


def _reach(doc: dict[str, Any], roots: set[str]) -> set[str]:
    schemas = doc.get("components", {}).get("schemas", {})
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name not in seen and name in schemas:
            seen.add(name)
            todo += _refs(schemas[name])
    return seen


def close_request_objects(doc: dict[str, Any]) -> dict[str, Any]:
    """Say what the app does with request bodies: an unknown field, at any depth, is 400.
    Every object schema only request bodies use gets ``additionalProperties: false`` (one an
    answer uses too stays open: a newer server may add fields to an answer)."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    requests, answers = set(), set()
    for ops in doc.get("paths", {}).values():
        for op in ops.values():
            requests |= _refs(op.get("requestBody", {}))
            answers |= _refs(op.get("responses", {})) | _refs(op.get("parameters", []))
    for name in _reach(doc, requests) - _reach(doc, answers):
        schema = schemas[name]
        if schema.get("type") == "object" and "properties" in schema:
            schema.setdefault("additionalProperties", False)
    return doc


BEARER = "bearerAuth"


def bearer_scheme(doc: dict[str, Any], description: str, open_paths: tuple[str, ...] = (),
                  refused: str = "no `Authorization: Bearer <token>`, or another token") -> dict[str, Any]:
    """Declare the server's token as an HTTP bearer scheme, required (with its 401, whose
    description ``refused`` says when) by every operation but those at ``open_paths``."""
    components = doc.setdefault("components", {})
    components.setdefault("securitySchemes", {})[BEARER] = {"type": "http", "scheme": "bearer",
                                                            "description": description}
    unauthorized = {"description": f"unauthorized: {refused}",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
    for path, ops in doc.get("paths", {}).items():
        if path in open_paths:
            continue
        for op in ops.values():
            op["security"] = [{BEARER: []}]
            op.setdefault("responses", {})["401"] = dict(unauthorized)
    return doc
