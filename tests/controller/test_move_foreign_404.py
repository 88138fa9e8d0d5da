"""A 404 that is not the host agent's own answer never reads as "the host holds nothing".

A move asks the target whether it holds the VM (GET, 404 = no) and tells it to drop an
incoming copy (DELETE, 404 = nothing there). When the link to the target is cut, the
traffic can end at a proxy or gateway that answers every request with an empty 404: read
as the agent's word, a move rolled back (waking the source) while the target's copy ran —
the VM on two hosts — or recorded the target clean with its half-copied file left for good.
"""

from __future__ import annotations

import asyncio
import types

import httpx
import pytest

from fuse.errors import HostUnreachable
from fuse.controller.moves import MoveService


def service(reply: httpx.Response) -> MoveService:
    class Conn:
        async def request(self, method, path, **kw):
            return reply

    ctl = types.SimpleNamespace(store=None, fleet=types.SimpleNamespace(conn=lambda host: Conn()))
    return MoveService(ctl)


ROW = {"id": "m1", "vm": "v", "target": "b", "source": "a", "record": {"was_running": True}}


@pytest.mark.parametrize("reply", [
    httpx.Response(404, text=""),
    httpx.Response(404, text="<html>Not Found</html>", headers={"content-type": "text/html"}),
    httpx.Response(404, json={"detail": "Not Found"}),
], ids=["an empty 404 (a proxy on a cut link)", "an HTML 404", "a JSON 404 without fuse's error body"])
def test_a_foreign_404_is_the_host_not_answering(reply):
    svc = service(reply)
    with pytest.raises(HostUnreachable, match="not the host agent's"):
        asyncio.run(svc._on_target(ROW))
    with pytest.raises(HostUnreachable, match="not the host agent's"):
        asyncio.run(svc._abort_target(ROW))


def test_the_agents_own_not_found_still_means_nothing_there():
    svc = service(httpx.Response(404, json={"error": {"code": "not_found", "message": "no vm named v on this host"}}))
    assert asyncio.run(svc._on_target(ROW)) is None
    asyncio.run(svc._abort_target(ROW))  # the incoming copy is gone: no error
