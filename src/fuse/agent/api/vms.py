"""Host API routes for VMs, moves' incoming side, events and usage.

Routes only parse and call the ``VmManager`` (``request.app.state.vms``);
errors are ``fuse.errors`` exceptions, which the app maps to
``{"error": {"code", "message"}}``. Bodies are read as the controller reads
its own (``fuse.controller.validation``): JSON only, known fields only, at
any depth, and one 400 ``invalid_argument`` in its words for what is wrong.
"""

from __future__ import annotations

import asyncio
import os
import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from ...controller.validation import JSON_HINT, reject_unknown_fields
from ...errors import InvalidArgument, NotFound
from ...models.errors import ErrorBody
from ...models.vm import (MOVE_ID_MAX, MOVE_ID_PATTERN, ClaimRequest, CreateVmRequest, IncomingRequest, SleepRequest,
                          WakeRequest)
from ..metering import exact_json, window
from ..vms import VmManager

async def json_body(request: Request) -> None:
    """A route that takes a JSON body refuses one sent as anything else, in the
    controller's words: FastAPI would leave it unparsed and answer pydantic's
    "Input should be a valid dictionary", which does not say what to change.
    (The raw-bytes routes, an incoming file's PUT, declare no body and pass.)"""
    if getattr(request.scope.get("route"), "body_field", None) is None:
        return
    content_type = request.headers.get("content-type")
    media = (content_type or "").split(";", 1)[0].strip().lower()
    is_json = media == "application/json" or (media.startswith("application/") and media.endswith("+json"))
    if not is_json and await request.body():
        got = f"it came as {content_type}" if content_type else "it came with no Content-Type"
        raise InvalidArgument(f"the body is not JSON ({got}): {JSON_HINT}")


# (json_body first: a body not sent as JSON is refused as such, before its fields are read)
router = APIRouter(tags=["vms"], dependencies=[Depends(json_body), Depends(reject_unknown_fields)])
MAX_READ = 64 * 2**20


def _vms(request: Request) -> VmManager:
    return request.app.state.vms


def _dump(vm) -> dict[str, Any]:
    return vm.model_dump(mode="json")


# An incoming move's id in its path: only one of these was ever begun (`IncomingRequest`)
IncomingId = Annotated[str, Path(max_length=MOVE_ID_MAX, pattern=MOVE_ID_PATTERN,
                                 description="the move's id: letters, digits, '-', '_' and '.'")]


def _move_id(request: Request, name: str, move_id: str | None) -> str | None:
    """A wake's or delete's ``move_id``, refused (400) unless it is one a move may have
    (`MOVE_ID_PATTERN`), or the mark VM ``name`` holds already: an agent before this one
    marked a VM with any string it was given, and that VM must stay wakeable and removable
    by its own move's id (review 38)."""
    if move_id is None or (len(move_id) <= MOVE_ID_MAX and re.fullmatch(MOVE_ID_PATTERN, move_id)):
        return move_id
    try:
        if _vms(request).get(name).move_id == move_id:
            return move_id
    except NotFound:
        pass
    raise InvalidArgument(f"move_id {ascii(move_id)[:80]} is not a move's id: letters, digits, '-', '_' and '.' "
                          f"only, {MOVE_ID_MAX} at most, not '.' or '..'")


@router.post("/v1/host/vms", status_code=201, summary="Create a VM: admit it and boot it.")
async def create_vm(request: Request, body: CreateVmRequest) -> dict[str, Any]:
    return _dump(await _vms(request).create(body))


@router.get("/v1/host/vms", summary="List this host's VMs.")
async def list_vms(request: Request) -> dict[str, Any]:
    return {"vms": [_dump(v) for v in _vms(request).list()]}


@router.get("/v1/host/vms/{name}", summary="Get one VM.")
async def get_vm(request: Request, name: str) -> dict[str, Any]:
    return _dump(_vms(request).get(name))


@router.get("/v1/host/vms/{name}/console",
            summary="Serial console output from a byte offset (one past the end: from the end).")
async def get_console(request: Request, name: str, offset: int = 0) -> dict[str, Any]:
    # an offset past the log's end, however far, reads from the end (VmManager.console)
    return _vms(request).console(name, offset)


@router.delete("/v1/host/vms/{name}", status_code=204,
               summary="Stop and remove a VM (a VM held by a move needs its move_id).")
async def delete_vm(request: Request, name: str,
                    move_id: str | None = Query(None, min_length=1)) -> Response:  # ("": no move's, not none)
    await _vms(request).delete(name, _move_id(request, name, move_id))
    return Response(status_code=204)


@router.post("/v1/host/vms/{name}/claim",
             summary="Give a running standby VM its entry (and a new name); it starts at once.")
async def claim_vm(request: Request, name: str, body: ClaimRequest) -> dict[str, Any]:
    return _dump(await _vms(request).claim(name, body))


@router.post("/v1/host/vms/{name}/sleep", summary="Write the VM's state to files and stop its process.")
async def sleep_vm(request: Request, name: str, body: SleepRequest | None = None) -> dict[str, Any]:
    return _dump(await _vms(request).sleep(name, (body or SleepRequest()).move_id))


@router.post("/v1/host/vms/{name}/wake", summary="Resume a sleeping VM from its files, or clear its mark.")
async def wake_vm(request: Request, name: str, body: WakeRequest | None = None) -> dict[str, Any]:
    body = body or WakeRequest()
    return _dump(await _vms(request).wake(name, _move_id(request, name, body.move_id), body.clear_mark,
                                          body.if_marked))


@router.get("/v1/host/vms/{name}/files", summary="A sleeping VM's state files, with sizes and SHA-256.")
async def list_files(request: Request, name: str) -> dict[str, Any]:
    return {"files": [f.model_dump() for f in _vms(request).state_files(name)]}


# The two raw-bytes routes of a move, documented as such (FastAPI would say JSON, and no body):
# the document only; neither route changes (the PUT still declares no body field to parse).
RAW = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


@router.get("/v1/host/vms/{name}/files/{file}", summary="Read a state file by byte range.",
            response_class=Response,
            responses={200: {"description": "the file's raw bytes from offset: length of them, fewer at its end",
                             "content": RAW,
                             "headers": {"X-File-Size": {"description": "the whole file's size in bytes",
                                                         "schema": {"type": "integer"}},
                                         "X-Offset": {"description": "the byte these start at (the offset asked)",
                                                      "schema": {"type": "integer"}}}}})
async def read_file(request: Request, name: str, file: str, offset: int = 0,
                    length: int = Query(default=4 * 2**20, ge=1, le=MAX_READ)) -> Response:
    path = _vms(request).state_file(name, file)
    gone = NotFound(f"vm {name}'s state file {file} is listed but gone from this host's disk")
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise gone from None
    if not 0 <= offset <= size:
        raise InvalidArgument(f"offset {offset} is outside {file} ({size} bytes)")

    def _read() -> bytes:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.pread(fd, min(length, size - offset), offset)
        finally:
            os.close(fd)
    try:
        data = await asyncio.to_thread(_read)
    except FileNotFoundError:
        raise gone from None
    return Response(content=data, media_type="application/octet-stream",
                    headers={"X-File-Size": str(size), "X-Offset": str(offset)})


@router.post("/v1/host/incoming", status_code=201, summary="Begin receiving a moved VM (reserves room).")
async def begin_incoming(request: Request, body: IncomingRequest) -> dict[str, Any]:
    return await _vms(request).incoming.begin(body)


@router.get("/v1/host/incoming", summary="Incoming moves in flight or installed but not yet woken.")
async def list_incoming(request: Request) -> dict[str, Any]:
    return {"incoming": _vms(request).incoming.list()}


@router.put("/v1/host/incoming/{move_id}/files/{file}", summary="Write raw bytes at an offset.",
            openapi_extra={"requestBody": {"required": True, "content": RAW,
                                           "description": "the chunk's raw bytes, written at offset (64 MiB at "
                                                          "most)"}},
            responses={413: {"model": ErrorBody, "description": "invalid_argument: the chunk is over 64 MiB"}})
async def put_incoming_file(request: Request, move_id: IncomingId, file: str, offset: int = 0) -> dict[str, Any]:
    # Refused before its body is read (a chunk past MAX_CHUNK is 413 before this): with the length
    # it declares, or, chunked, as far as its offset says (``write`` checks the length it had)
    declared = request.headers.get("content-length", "")
    _vms(request).incoming.check_write(move_id, file, offset, int(declared) if declared.isdigit() else 0)
    return await _vms(request).incoming.write(move_id, file, offset, await request.body())


@router.post("/v1/host/incoming/{move_id}/verify", summary="Sizes and SHA-256 of the files as received.")
async def verify_incoming(request: Request, move_id: IncomingId) -> dict[str, Any]:
    return await _vms(request).incoming.verify(move_id)


@router.post("/v1/host/incoming/{move_id}/install", summary="Verify the files; install as a sleeping VM.")
async def install_incoming(request: Request, move_id: IncomingId) -> dict[str, Any]:
    return _dump(await _vms(request).incoming.install(move_id))


@router.delete("/v1/host/incoming/{move_id}", status_code=204, summary="Abort an incoming move (idempotent).")
async def abort_incoming(request: Request, move_id: IncomingId) -> Response:
    await _vms(request).incoming.abort(move_id)
    return Response(status_code=204)


@router.get("/v1/host/events", summary="Events with id > since, oldest first (long poll with wait_s).")
async def list_events(request: Request, since: int = 0, limit: int = 100, wait_s: float = 0) -> dict[str, Any]:
    return await request.app.state.events.page(since, limit, wait_s)


@router.get("/v1/host/usage", summary="Per-VM metering over [from, to) with exact totals.")
async def get_usage(request: Request, from_: str | None = Query(default=None, alias="from"),
                    to: str | None = None) -> dict[str, Any]:
    start, end = window(from_, to)
    # Exact decimals, which the default JSON rendering would turn into floats.
    return Response(exact_json(_vms(request).metering.usage(start, end)), media_type="application/json")


