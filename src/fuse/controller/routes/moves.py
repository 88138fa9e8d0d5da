"""/v1/moves: moving running VMs between hosts."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ...models.errors import STORE_ROUTES, responses
from ...models.moves import Move, MoveList, MoveRequest

router = APIRouter(tags=["moves"], responses=STORE_ROUTES)

REFUSALS = ("not_movable (no such VM, or not running or sleeping), ambiguous_vm (the name is on several hosts: "
            "give host; `hosts` lists them), same_host, unknown_host, arch_mismatch (platform, the VM's bundle (its "
            "name with its fingerprint) or Firecracker release differ), no_target (none has room, or the named target is cordoned or draining, has a VM of "
            "that name, or still holds the copy a failed move of this VM left there and could not remove yet; the "
            "VM is left untouched; when best fit found no target among other hosts, `hosts` maps each to its reason), "
            "move_in_progress, host_unreachable (the source or the target does not answer)")


@router.post("/v1/moves", status_code=202, response_model=Move,
             responses=responses(s409=REFUSALS,
                                 s400="invalid_argument: no vm named, an empty vm, to or host (each names something: "
                                      "leave to out for best fit, host unless the name is on several hosts), "
                                      "vm and flashvm naming different VMs, an unknown field, or a body that is "
                                      "not JSON"),
             summary="createMove: move a running or sleeping VM (202), or 409 with why not.")
async def create_move(request: Request, body: MoveRequest) -> JSONResponse:
    return JSONResponse(await request.app.state.ctl.moves.create(body.model_dump(exclude_none=True)),
                        status_code=202)


@router.get("/v1/moves", response_model=MoveList, summary="listMoves: every move, oldest first.")
async def list_moves(request: Request) -> dict:
    return {"moves": request.app.state.ctl.moves.list()}


@router.get("/v1/moves/{move_id}", response_model=Move, responses=responses(s404="not_found: no such move"),
            summary="getMove: one move with copied_bytes of total_bytes.")
async def get_move(request: Request, move_id: str) -> JSONResponse:
    return JSONResponse(request.app.state.ctl.moves.get(move_id))
