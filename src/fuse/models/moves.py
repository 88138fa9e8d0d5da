"""Wire records of moves and drains (seed 004), for the OpenAPI document.

The routes answer plain dicts of exactly these shapes (``MoveService._wire``,
``MoveService.drain``); the models name and describe the fields.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import ConfigDict, Field, field_validator, model_validator

from .base import Record

MoveState = Literal["starting", "sleeping", "copying", "waking", "done", "failed"]


# What an empty (or blank) name in a move request is told: every field names
# something, so "" is a mistake to point out, never a name to look up (a
# target "" read as a host called "" answered 409 unknown_host "host  is not
# registered"). Left out, the optional ones mean what their descriptions say.
BLANK = {
    "vm": "must name the VM to move, not be empty",
    "flashvm": "must name the VM to move, not be empty (or send vm)",
    "to": "must name the target host, not be empty: leave to out to have best fit choose the target",
    "host": "must name the host the VM is on, not be empty: leave host out unless the name is on several hosts",
}


class MoveRequest(Record):
    """``POST /v1/moves``: the VM (``vm``, or the seed's ``flashvm``), an
    optional target (default: best fit) and, when the name is on several
    hosts, the one it is on. A field given names something: an empty or
    blank one is a 400 ``invalid_argument`` (leave an optional one out), and
    so are ``vm`` and ``flashvm`` naming two different VMs (the same name in
    both is one VM)."""

    vm: Optional[str] = Field(None, description="the VM to move (required, as vm or flashvm)")
    flashvm: Optional[str] = Field(None, description="seed 004's name for vm")
    to: Optional[str] = Field(None, description="the target host; leave it out to have best fit choose one")
    host: Optional[str] = Field(None, description="the host the VM is on, when its name is on several hosts")

    @field_validator("vm", "flashvm", "to", "host")
    @classmethod
    def _not_blank(cls, value: Optional[str], info) -> Optional[str]:
        if value is not None and not value.strip():
            raise ValueError(BLANK[info.field_name])
        return value

    @model_validator(mode="after")
    def _one_vm(self) -> "MoveRequest":
        # Two names for one field: moving either one quietly (it moved vm and
        # left flashvm's VM where it was) answers a request nobody made.
        if self.vm is not None and self.flashvm is not None and self.vm != self.flashvm:
            raise ValueError(f"vm {self.vm!r} and flashvm {self.flashvm!r} name different VMs: flashvm is seed "
                             "004's name for vm, so send one of them (or the same name in both)")
        return self


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
    reason: str = Field("", description="why the move failed (or is rolling back); empty once done")
    source_removed: bool = Field(False, description="done: the source copy is gone. False on a done move "
                                 "while a source that did not answer still holds its copy (asleep, marked "
                                 "with the move: it never wakes); the controller removes it once the source "
                                 "answers, and the host cannot be deregistered until then")
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
                                  "move_failed (it ran and brought the VM home: see move), drain_stopped "
                                  "(the host was uncordoned, cordoned or deregistered before the drain tried it), "
                                  "or standby (a prewarm's standby VM its prewarm could not place elsewhere)")
    reason: str
    move: Optional[str] = Field(None, description="the failed move (move_failed)")


class DrainFinished(Record):
    """A VM whose run is over: nothing to move and nothing to do."""

    vm: str
    state: str = Field(description="exited (its entry finished) or failed (its process died or never started)")


class DrainReport(Record):
    """What a drain moved and what it could not (reported, never killed). A drain
    stopped part way (the host no longer draining) reports every VM it did not try
    as stuck with code ``drain_stopped``. VMs whose run is over are in ``finished``,
    never in ``stuck``: they need nothing, and the host deregisters with them."""

    host: str
    moved: list[DrainMoved]
    stuck: list[DrainStuck] = Field(description="VMs still on the host that keep it from being deregistered")
    finished: list[DrainFinished] = Field(
        [], description="VMs whose run is over (exited, failed): nothing to move, they hold no room and do not "
                        "keep the host from being deregistered (they go with it); delete them to drop their records")
    prewarmed: list[str] = Field(
        [], description="a prewarm's standby VMs that were on the host: not moved (they have no entry yet); their "
                        "prewarm placed them again on other hosts and removed them here. Those it could not place "
                        "elsewhere are in stuck with code standby")
