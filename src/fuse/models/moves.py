"""Wire records of moves and drains (seed 004), for the OpenAPI document.

The routes answer plain dicts of exactly these shapes (``MoveService._wire``,
``MoveService.drain``); the models name and describe the fields.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import ConfigDict, Field

from .base import Record

MoveState = Literal["starting", "sleeping", "copying", "waking", "done", "failed"]


class MoveRequest(Record):
    """``POST /v1/moves``: the VM (``vm``, or the seed's ``flashvm``), an
    optional target (default: best fit) and, when the name is on several
    hosts, the one it is on."""

    vm: Optional[str] = None
    flashvm: Optional[str] = None
    to: Optional[str] = None
    host: Optional[str] = None


class MoveStep(Record):
    state: MoveState
    time: float


class Move(Record):
    """One move. ``state`` is one of the seed's six; while a failed step brings
    the VM home the move stays at that step with ``rolling_back`` true, and
    reads ``failed`` only once the VM is back on its source."""

    model_config = ConfigDict(populate_by_name=True)

    id: str
    vm: str
    from_: str = Field(alias="from", description="the source host")
    to: str = Field(description="the target host")
    state: MoveState
    rolling_back: bool = False
    copied_bytes: int = 0
    total_bytes: int = 0
    copy_path: str = Field("", description="bulk (the agents' splice protocol) or http")
    copy_secs: Optional[float] = None
    verify_secs: Optional[float] = None
    reason: str = Field("", description="why the move failed (or is rolling back)")
    created_at: float
    updated_at: float
    history: list[MoveStep] = []


class MoveList(Record):
    moves: list[Move]


class DrainMoved(Record):
    vm: str
    move: str
    to: str


class DrainStuck(Record):
    """A VM the drain could not move, and why."""

    vm: str
    code: str = Field(description="the move's refusal code (POST /v1/moves: not_movable, no_target, ...), "
                                  "move_failed (it ran and brought the VM home: see move), or drain_stopped "
                                  "(the host was uncordoned, cordoned or deregistered before the drain tried it)")
    reason: str
    move: Optional[str] = Field(None, description="the failed move (move_failed)")


class DrainReport(Record):
    """What a drain moved and what it could not (reported, never killed). A drain
    stopped part way (the host no longer draining) reports every VM it did not try
    as stuck with code ``drain_stopped``."""

    host: str
    moved: list[DrainMoved]
    stuck: list[DrainStuck]
