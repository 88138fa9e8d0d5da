"""/v1/vms: VMs placed by best fit, and the per-VM calls."""

from __future__ import annotations

from typing import Any, Optional

from fastapi import APIRouter, Body, Request, Response

router = APIRouter(tags=["vms"])


def _vms(request: Request):
    return request.app.state.ctl.vms


@router.post("/v1/vms", status_code=201, summary="createVm: place a VM on the best host (409 fleet_full, vm_exists).")
async def create_vm(request: Request, body: dict[str, Any] = Body(...)) -> dict:
    return await _vms(request).create(body)


@router.get("/v1/vms", summary="listVms: every VM on every host, tagged with its host.")
async def list_vms(request: Request, host: Optional[str] = None) -> dict:
    return {"vms": _vms(request).list(host)}


@router.get("/v1/vms/{name}", summary="getVm: one VM (409 ambiguous_vm unless host picks one).")
async def get_vm(request: Request, name: str, host: Optional[str] = None) -> dict:
    return await _vms(request).get(name, host)


@router.delete("/v1/vms/{name}", status_code=204, summary="deleteVm: stop and remove a VM.")
async def delete_vm(request: Request, name: str, host: Optional[str] = None) -> Response:
    await _vms(request).delete(name, host)
    return Response(status_code=204)


@router.post("/v1/vms/{name}/sleep", summary="sleepVm: write the VM's state to files and free its memory.")
async def sleep_vm(request: Request, name: str, host: Optional[str] = None) -> dict:
    return await _vms(request).act(name, "sleep", host)


@router.post("/v1/vms/{name}/wake", summary="wakeVm: carry on from the instant it slept.")
async def wake_vm(request: Request, name: str, host: Optional[str] = None) -> dict:
    return await _vms(request).act(name, "wake", host)


@router.get("/v1/vms/{name}/console", summary="getVmConsole: the serial log from a byte offset.")
async def vm_console(request: Request, name: str, offset: int = 0, host: Optional[str] = None) -> dict:
    return await _vms(request).console(name, offset, host)
