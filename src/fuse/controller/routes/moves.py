"""/v1/moves: moving running VMs between hosts."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse

router = APIRouter(tags=["moves"])


@router.post("/v1/moves", status_code=202, summary="createMove: move a running or sleeping VM (202), or 409 with why not.")
async def create_move(request: Request, body: dict[str, Any] = Body(...)) -> JSONResponse:
    return JSONResponse(await request.app.state.ctl.moves.create(body), status_code=202)


@router.get("/v1/moves", summary="listMoves: every move, oldest first.")
async def list_moves(request: Request) -> dict:
    return {"moves": request.app.state.ctl.moves.list()}


@router.get("/v1/moves/{move_id}", summary="getMove: one move with copied_bytes of total_bytes.")
async def get_move(request: Request, move_id: str) -> dict:
    return request.app.state.ctl.moves.get(move_id)
