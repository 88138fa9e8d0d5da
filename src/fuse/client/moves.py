"""client.moves: move running VMs between hosts."""

from __future__ import annotations

from typing import Any, Callable

from ._core import Call, path, record, record_list

MOVE = record("id", "vm", "state")  # (a Move's fields)

TERMINAL = ("done", "failed")


class MovesAPI:
    def __init__(self, send: Callable[[Call], Any]):
        self._send = send

    def create(self, vm: str, to: str | None = None, host: str | None = None) -> dict:
        """Start moving `vm` (to `to`, or the best fit); returns the move (202)."""
        # ("" is sent as given: the controller refuses it rather than choose a target unasked)
        body = {"vm": vm} | ({"to": to} if to is not None else {}) | ({"host": host} if host is not None else {})
        return self._send(Call("POST", "/v1/moves", body=body, timeout=120, parse=MOVE))

    def list(self) -> list[dict]:
        return self._send(Call("GET", "/v1/moves", parse=record_list("moves", "id", "vm", "state")))

    def get(self, move_id: str) -> dict:
        return self._send(Call("GET", path("/v1/moves", move_id), parse=MOVE))
