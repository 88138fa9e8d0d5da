"""The merged event stream's page (``GET /v1/events``), for the OpenAPI document.

The route answers the plain dict ``EventService.list`` builds; these models
name and describe its fields without touching the JSON on the wire.
"""

from __future__ import annotations

from typing import Optional

from pydantic import ConfigDict, Field

from .base import Record


class Event(Record):
    """One event, tagged with its host. Each type adds its own fields beside
    these (``vm``, ``to``, ``move``, ...)."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")

    id: int = Field(description="the controller's cursor: increasing, never reused")
    time: float = Field(description="unix seconds")
    type: str = Field(description="a host's own (vm_state, ...) or the controller's: host_added, host_removed, "
                                  "host_connected, host_disconnected, placed, move_state, ...")
    host: str = Field(description="the host it happened on")
    host_event_id: Optional[int] = Field(None, description="the host's own id for it (host events only)")


class EventPage(Record):
    """Events after ``since``, oldest first. Pass ``next_cursor`` as the next
    ``since``; ``next`` is the same value under its older name."""

    events: list[Event]
    next_cursor: int = Field(description="the last event's id, or since when there were none (the newest "
                             "event's id when since was beyond it: resume from there)")
    next: int = Field(description="the same as next_cursor (kept for older clients)")
