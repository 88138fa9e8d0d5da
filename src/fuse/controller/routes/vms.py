"""/v1/vms: VMs placed by best fit, and the per-VM calls.

The routes answer the services' dicts as they are (JSONResponse); the
response models only document them."""

from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse

from ...errors import InvalidArgument, NotFound
from ...models.errors import STORE_ROUTES, db_done, responses
from ...models.vm import ConsoleChunk, PlacedVm, PlacedVmList
from ..vms import ControllerCreateVm

router = APIRouter(tags=["vms"], responses=STORE_ROUTES)

NOT_FOUND = "not_found: no such VM (or no such VM on the host given)"
AMBIGUOUS = ("ambiguous_vm: the name is on several hosts (error.hosts lists them); pick one with host; "
             "conflict (error.being_created, error.host): no VM of the name is recorded yet, but a create of it "
             "is under way or went unanswered there (the host may still make it): ask again once it has answered")
UNREACHABLE = ("host_unreachable: the VM's host does not answer; unauthorized: its agent refused the "
               "controller's token (register the host again with the agent's current token)")

# A host's own failure passes through as its 500, with its code (``host_error``).
FAILED = "internal: an unexpected failure (the server's log has the details); or the host's own code: "


def host_query(description: str = "The host the VM is on, when its name is on several hosts (not empty: "
                                   "leave it out)."):
    """``?host=``: empty is refused (400) in the service's words, so the document states its
    minLength rather than have it checked first in other words."""
    return Query(None, json_schema_extra={"minLength": 1}, description=description)


def _vms(request: Request):
    return request.app.state.ctl.vms


@router.post("/v1/vms", status_code=201, response_model=PlacedVm,
             responses=responses(s400="invalid_argument: a field is missing, unknown or out of range, the body is "
                                      "not JSON, standby (prewarms keep those), no host it may go to has the "
                                      "bundle, or the host refused the body (no such bundle, entry too long)",
                                 s404="not_found: the host given to pin the VM is not registered",
                                 s409="vm_exists: the name is already used on the chosen host, or another "
                                      "create of it is under way (on the pinned host, or for a create "
                                      "placement chooses the host of, on any host): checked before room, so a "
                                      "full pinned host still answers vm_exists; fleet_full: no host took the VM "
                                      "(error.hosts maps every host to its reason)",
                                 s500=FAILED + "boot_failed (its hypervisor did not boot the VM, now failed "
                                               "there), io_error (its disk did not take the VM's record); a "
                                               "prewarmed VM that does not take the entry is not passed on: "
                                               "the create tries another, or a new VM",
                                 s502="host_unreachable: the chosen host did not answer the create (error.host, "
                                      "error.vm); it may still create the VM, so no other host was tried",
                                 s503=db_done("host and vm", "created the VM", "shows it")),
             summary="createVm: place a VM on the best host (409 fleet_full, vm_exists; 502 host_unreachable).")
async def create_vm(request: Request, body: ControllerCreateVm) -> JSONResponse:
    if body.standby:  # (a VM booted with no entry that nothing here could ever claim)
        raise InvalidArgument("standby VMs are kept by prewarms (POST /v1/prewarms): a VM created here "
                              "runs its entry")
    vm = await _vms(request).create(body.model_dump(mode="json", exclude_unset=True))
    return JSONResponse(vm, status_code=201)


@router.get("/v1/vms", response_model=PlacedVmList,
            responses=responses(s400="invalid_argument: host is empty",
                                s404="not_found: the controller knows no host of that name (none registered, "
                                     "bought by the elastic pool, or holding a VM)"),
            summary="listVms: every VM on every host, tagged with its host (or on the host given).")
async def list_vms(request: Request, host: Optional[str] = host_query(
        "Only this host's VMs (not empty: leave it out for every host's).")) -> JSONResponse:
    if host == "":  # (as a create's host: "" names none)
        raise InvalidArgument("host must name a host (leave it out for every host's VMs)")
    vms = _vms(request).list(host)
    if host is not None and not vms and not _known_host(request, host):
        # As when a create pins it: a misspelt name must not read as "no VMs there".
        raise NotFound(f"host {host} not found")
    return JSONResponse({"vms": vms})


def _known_host(request: Request, host: str) -> bool:
    """A registered host, or a machine the elastic pool bought (booting, not
    registered yet, or gone): listing its VMs is an answer, even if empty."""
    ctl = request.app.state.ctl
    try:
        ctl.hosts.get(host)
        return True
    except NotFound:
        return any(h.name == host for h in ctl.pool.hosts(include_gone=True))


@router.get("/v1/vms/{name}", response_model=PlacedVm,
            responses=responses(s404=NOT_FOUND, s409=AMBIGUOUS, s502=UNREACHABLE),
            summary="getVm: one VM (409 ambiguous_vm unless host picks one).")
async def get_vm(request: Request, name: str, host: Optional[str] = host_query()) -> JSONResponse:
    return JSONResponse(await _vms(request).get(name, host))


@router.delete("/v1/vms/{name}", status_code=204,
               responses=responses(s404=NOT_FOUND,
                                   s409=AMBIGUOUS + "; move_in_progress: a move holds the VM",
                                   s502=UNREACHABLE,
                                   s503=db_done('host, vm and done ("delete")', "deleted the VM",
                                                "no longer shows it")),
               summary="deleteVm: stop and remove a VM.")
async def delete_vm(request: Request, name: str, host: Optional[str] = host_query()) -> Response:
    await _vms(request).delete(name, host)
    return Response(status_code=204)


@router.post("/v1/vms/{name}/sleep", response_model=PlacedVm,
             responses=responses(s404=NOT_FOUND,
                                 s409=AMBIGUOUS + "; conflict: the VM is not running; move_in_progress: a move "
                                                  "holds the VM",
                                 s500=FAILED + "sleep_failed (the VM was not saved and runs on), bundle_missing "
                                               "(its bundle is gone from the host: nothing could wake it there; "
                                               "a move still can)",
                                 s502=UNREACHABLE,
                                 s503=db_done('host, vm and done ("sleep")', "put the VM to sleep",
                                              "shows it sleeping")),
             summary="sleepVm: write the VM's state to files and free its memory.")
async def sleep_vm(request: Request, name: str, host: Optional[str] = host_query()) -> JSONResponse:
    return JSONResponse(await _vms(request).act(name, "sleep", host))


@router.post("/v1/vms/{name}/wake", response_model=PlacedVm,
             responses=responses(s404=NOT_FOUND,
                                 s409=AMBIGUOUS + "; conflict: the VM is not sleeping, or a wake of it is under way; "
                                                  "host_full: its host has no room for it now (its memory, or its "
                                                  "vm_count policy, counting the VMs that hold room there, never "
                                                  "the one being woken); move_in_progress: a move holds the VM",
                                 s500=FAILED + "wake_failed (it sleeps on as it was), bundle_missing (its "
                                               "bundle is gone from the host)",
                                 s502=UNREACHABLE,
                                 s503=db_done('host, vm and done ("wake")', "woke the VM", "shows it running")),
             summary="wakeVm: carry on from the instant it slept.")
async def wake_vm(request: Request, name: str, host: Optional[str] = host_query()) -> JSONResponse:
    return JSONResponse(await _vms(request).act(name, "wake", host))


@router.get("/v1/vms/{name}/console", response_model=ConsoleChunk,
            responses=responses(s400="invalid_argument: offset below 0, or not an integer", s404=NOT_FOUND,
                                s409=AMBIGUOUS, s502=UNREACHABLE),
            summary="getVmConsole: the serial log from a byte offset.")
async def vm_console(request: Request, name: str,
                     offset: int = Query(0, json_schema_extra={"minimum": 0},  # (the host's check, its words)
                                         description="The byte to read from (a reply's next_offset); one past "
                                                     "the log's end, however far, reads from the end."),
                     host: Optional[str] = host_query()) -> JSONResponse:
    return JSONResponse(await _vms(request).console(name, offset, host))
