"""/v1/hosts: the host registry, wire-compatible with the Fuse orchestrator's
hosts API (folsom-fuse)."""

from __future__ import annotations

import base64
from typing import Any, Literal

from fastapi import APIRouter, Body, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from ...errors import Conflict, InvalidArgument, NotFound
from ...models.errors import STORE_ROUTES, responses
from ...models.hosts import Host, HostPage, RegisterHostRequest
from ...models.moves import DrainReport
from ..validation import unknown_fields

router = APIRouter(tags=["hosts"], responses=STORE_ROUTES)


def _ctl(request: Request):
    return request.app.state.ctl


def _register_body(body: dict[str, Any]) -> tuple[RegisterHostRequest, bool]:
    """Accept seed 000's `{id, url, ...}` and seed 004's `{name, addr}`, and say
    which it was. The short form is the operator's `hosts add`: a missing
    vm_count there takes the CLI's documented default of 16 rather than
    failing, and a missing backend is the one the agent runs (seed 004 has no
    backend field; seed 000's default, firecracker, is for its own form).
    A bad field is named as the caller spelt it (`name`, not `id`)."""
    given = body
    body = dict(body)
    spelt: dict[str, str] = {}  # the model's name -> the caller's
    short = "id" not in body and "name" in body
    if short:
        body["id"] = body.pop("name")
        spelt["id"] = "name"
        capacity = body.setdefault("capacity", {})
        if isinstance(capacity, dict):
            body["capacity"] = {"vm_count": 16} | capacity
    if "url" not in body and "addr" in body:
        body["url"] = body.pop("addr")
        spelt["url"] = "addr"
    elif "url" not in body and "id" not in given:  # missing: named in the form the caller used, or both
        spelt["url"] = "addr" if short else "url (or addr)"
    if "id" not in body:
        spelt["id"] = "id (or name)"
    errors = []
    for long, brief in (("id", "name"), ("url", "addr")):
        if long in given and brief in given:  # (one field, spelt both ways: which was meant?)
            errors.append({"type": "value_error", "loc": (brief,), "input": given[brief],
                           "msg": f"is {long} in seed 004's form: give {long} or {brief}, not both"})
            body.pop(brief, None)
        elif body.get(long) == "":  # (named as the caller spelt it, not by the service's later check)
            errors.append({"type": "value_error", "loc": (long,), "input": "", "msg": "must not be empty"})
    errors += unknown_fields(RegisterHostRequest, body)
    try:
        # strict: a capacity of `true` or `"3"` is a mistake to name, not a 1 or a 3 to guess
        # (the record itself stays lenient: the SDK reads answers with it)
        req = RegisterHostRequest.model_validate(body, strict=True)
    except ValidationError as exc:
        errors += exc.errors()
    if errors:
        def as_spelt(loc: tuple) -> tuple:
            return ("body", spelt.get(loc[0], loc[0]), *loc[1:]) if loc else ("body",)
        raise RequestValidationError([e | {"loc": as_spelt(tuple(e["loc"]))} for e in errors], body=given)
    return req, short


@router.post("/v1/hosts", status_code=201, response_model=Host,
             responses={200: {"model": Host, "description": "re-registered: an update, state and VMs kept"},
                        **responses(s400="invalid_argument: a field is missing, unknown or out of range (vm_count, id, "
                                         "backend, gpus or mig_profiles on a firecracker host, a MIG profile name), "
                                         "or a capacity field is not an integer (true, \"3\" and 2.5 are refused, "
                                         "never read as numbers)",
                                    s409="conflict: the id moves to another url while VMs are assigned to it, or while "
                                         "a create waits on the host (one waiting on its answer, or one it did not "
                                         "answer until it says whether the VM landed)",
                                    s502="host_unreachable: the agent cannot be reached while a capacity field is "
                                         "left to probe, the url answers but is not a fuse agent, or trust failed: "
                                         "the host's SSH host key or TLS certificate does not verify (an https:// "
                                         "host's included), or the host refused the controller's key or "
                                         "certificate; a failed trust is refused even with every capacity field "
                                         "declared, and nothing is stored; "
                                         "unauthorized: the agent refused the token")},
             summary="registerHost: add a host, probing its hardware.")
async def register_host(request: Request, body: dict[str, Any] = Body(...)) -> JSONResponse:
    req, short = _register_body(body)
    host, created = await _ctl(request).register_host(req, backend_from_probe=short)
    answer = host.model_dump(mode="json")
    if short:  # seed 004's names for the same two fields, beside seed 000's
        answer |= {"name": host.id, "addr": req.url}
    return JSONResponse(answer, status_code=201 if created else 200)


def _cursor_encode(host_id: str) -> str:
    return base64.urlsafe_b64encode(host_id.encode()).decode().rstrip("=")


def _cursor_decode(cursor: str) -> str:
    """The id a cursor from `_cursor_encode` stands for. Anything else is 400:
    b64decode skips characters outside its alphabet, so "!!!" would
    otherwise read as "" and quietly start the listing over."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        after = base64.b64decode(padded, altchars=b"-_", validate=True).decode()
    except (ValueError, UnicodeError):
        after = ""
    if not after or _cursor_encode(after) != cursor:
        raise InvalidArgument(f"cursor {cursor[:64]!r} is not one this server issued: pass next_cursor "
                              "from the previous page, or no cursor to start at the beginning")
    return after


@router.get("/v1/hosts", response_model=HostPage,
            responses=responses(s400="invalid_argument: a limit below 0, or a cursor this server did not issue"),
            summary="listHosts: every host with capacity and allocations, by id.")
async def list_hosts(request: Request,
                     limit: int = Query(0, ge=0, description="Hosts per page; 0: all of them."),
                     cursor: str = Query("", description="next_cursor of the previous page; empty: the first "
                                                         "page.")) -> HostPage:
    hosts = _ctl(request).hosts.list()  # in Python's order of ids, the order `>` below compares in
    if cursor:
        after = _cursor_decode(cursor)
        hosts = [h for h in hosts if h.id > after]
    nxt = None
    if limit and len(hosts) > limit:
        hosts = hosts[:limit]
        nxt = _cursor_encode(hosts[-1].id)
    return HostPage(hosts=hosts, next_cursor=nxt)


@router.get("/v1/hosts/{host_id:path}", response_model=Host, responses=responses(s404="not_found: no such host"),
            summary="getHost: one host by id.")
async def get_host(request: Request, host_id: str) -> Host:
    return _ctl(request).hosts.get(_named(request, host_id))


def _named(request: Request, host_id: str) -> str:
    """``host_id``, or 404 saying the path names no host (`/v1/hosts/`: the route takes any
    path, so an empty id reaches it, which said "host  not found"), as other routes' empty ids say."""
    if not host_id:
        raise NotFound(f"{request.url.path}: an empty id names nothing")
    return host_id


@router.post("/v1/hosts/{host_id:path}", status_code=204,
             responses={200: {"model": DrainReport,
                              "description": "drain: what moved and what could not (each stuck VM with a code: the "
                                             "move's refusal, move_failed, or drain_stopped when the host was "
                                             "uncordoned, cordoned or deregistered before the drain tried it, "
                                             "or standby: a prewarm's standby VM its prewarm could not place "
                                             "elsewhere); VMs whose run is over (exited, failed) are listed in "
                                             "finished, not stuck: nothing to move, and they do not keep the host "
                                             "from being deregistered (they go with it); a prewarm's standby VMs "
                                             "are not moved: those their prewarm placed again elsewhere (and "
                                             "removed here) are listed in prewarmed"},
                        **responses(s404="not_found: no such host")},
             summary="actOnHost: cordon or uncordon (204); drain moves every VM away and reports (200).")
async def host_action(request: Request, host_id: str,
                      action: Literal["cordon", "uncordon", "drain"] = Query(...)) -> Response:
    ctl = _ctl(request)
    host_id = _named(request, host_id)
    if action == "drain":
        ctl.hosts.get(host_id)  # 404 before anything changes
        return JSONResponse(await ctl.drain(host_id))
    else:
        ctl.hosts.set_state(host_id, "cordoned" if action == "cordon" else "active")
    return Response(status_code=204)


@router.delete("/v1/hosts/{host_id:path}", status_code=204,
               responses=responses(s404="not_found: no such host",
                                   s409="conflict: VMs are still assigned to it (any but those whose run is "
                                        "over, exited or failed, which go with the host), or a create waits on the "
                                        "host: "
                                        "one (or a wake) waiting on its answer, or one it did not answer, until it "
                                        "says whether the VM landed (10 minutes at most); "
                                        "move_in_progress: a move still needs it (a copy to wake, abort or "
                                        "remove there); with force, conflict also while its agent answers; a machine the elastic "
                                        "pool added is removed through the pool (conflict), or with force, "
                                        "which ends the machine too"),
               summary="deregisterHost: remove a host with no VMs assigned.")
async def deregister_host(request: Request, host_id: str, force: bool = Query(False, description=(
        "For a host whose agent is gone for good: remove it with the VMs still assigned to it, the "
        "controller dropping their records (each a vm_lost event; the host_removed event lists them "
        "as forgotten_vms). Refused (409 conflict) while the agent answers: delete or drain them "
        "then. A create or move still waiting on the host refuses it as without force."))) -> Response:
    ctl = _ctl(request)
    host_id = _named(request, host_id)
    pool = getattr(ctl, "pool", None)
    if pool is not None and (row := pool.row(host_id)) is not None and row["state"] != "gone":
        if force:  # its agent gone for good: deregistered as any such host, and its machine ended
            await pool.remove_forced(host_id)
            return Response(status_code=204)
        # (deregistered, the machine ran on, paid for and counted against the budget, with
        # nothing to use it: the pool's removal terminates it and deregisters the host)
        raise Conflict(f"host {host_id} is a machine the elastic pool added (cloud {row['provider']}): remove it "
                       f"with POST /v1/pool/hosts/remove (fuse pool remove-host {host_id}), which ends the machine")
    await ctl.deregister_host(host_id, force=force)
    return Response(status_code=204)
