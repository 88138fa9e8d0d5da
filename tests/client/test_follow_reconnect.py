"""A controller that restarts under `events.follow` (sync and async): the
stream carries on from its cursor, nothing twice and nothing skipped; one
that stays away past `reconnect_s` ends it with a fuse.ApiError. Every other
call that gets no answer is a fuse.ApiError too (status 0, "unreachable"),
httpx's error kept as its cause."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

import fuse
from support import start_controller


def register(client, host_id: str) -> None:
    """A host_added event: a host at a closed port, with every figure declared."""
    client.hosts.register(fuse.RegisterHostRequest(id=host_id, url="http://127.0.0.1:9", backend="qemu",
                                                   capacity=fuse.HostCapacity(cpus=2, ram_mb=2048, storage_gb=10,
                                                                              vm_count=4)))


def check_stream(events: list[dict]) -> None:
    ids = [e["id"] for e in events]
    assert ids == sorted(set(ids)), ids  # nothing twice, in order
    assert [e["host"] for e in events if e["type"] == "host_added"] == ["before", "after"]


def restart(tmp_path, ctl):
    """Stop the controller, leave it away long enough for a few failed tries,
    start it again on the same state and socket, and add an event."""
    ctl.stop()
    time.sleep(1.5)
    ctl = start_controller(tmp_path)
    with fuse.Client(ctl.url) as c:
        register(c, "after")
    return ctl


def test_the_sync_follow_carries_on_across_a_controller_restart(tmp_path):
    ctl = start_controller(tmp_path)
    seen: list[dict] = []
    failed: list[BaseException] = []

    def follow() -> None:
        try:
            with fuse.Client(ctl.url) as c:
                for e in c.events.follow(0, wait_s=1):
                    seen.append(e)
                    if e["type"] == "host_added" and e["host"] == "after":
                        return
        except BaseException as exc:  # reported to the test below
            failed.append(exc)

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    try:
        with fuse.Client(ctl.url) as c:
            register(c, "before")
        deadline = time.monotonic() + 20
        while not any(e["type"] == "host_added" for e in seen) and time.monotonic() < deadline and not failed:
            time.sleep(0.05)
        ctl = restart(tmp_path, ctl)
        t.join(30)
        assert not failed, repr(failed[0])
        assert not t.is_alive(), "follow never saw the event added after the restart"
        check_stream(seen)
    finally:
        ctl.stop()


async def test_the_async_follow_carries_on_across_a_controller_restart(tmp_path):
    ctl = start_controller(tmp_path)
    seen: list[dict] = []

    async def follow() -> None:
        async with fuse.AsyncClient(ctl.url) as c:
            async for e in c.events.follow(0, wait_s=1):
                seen.append(e)
                if e["type"] == "host_added" and e["host"] == "after":
                    return

    task = asyncio.create_task(follow())
    try:
        async with fuse.AsyncClient(ctl.url) as c:
            await c.hosts.register(fuse.RegisterHostRequest(
                id="before", url="http://127.0.0.1:9", backend="qemu",
                capacity=fuse.HostCapacity(cpus=2, ram_mb=2048, storage_gb=10, vm_count=4)))
        for _ in range(400):
            if any(e["type"] == "host_added" for e in seen) or task.done():
                break
            await asyncio.sleep(0.05)
        ctl = await asyncio.to_thread(restart, tmp_path, ctl)
        await asyncio.wait_for(task, 30)
        check_stream(seen)
    finally:
        task.cancel()
        ctl.stop()


def refusing(tries: list[float]):
    """A transport whose controller is never there."""
    def handle(request: httpx.Request) -> httpx.Response:
        tries.append(time.monotonic())
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
    return handle


def test_the_sync_follow_gives_up_after_reconnect_s_with_an_api_error():
    tries: list[float] = []
    with fuse.Client("http://c", transport=httpx.MockTransport(refusing(tries))) as c:
        t0 = time.monotonic()
        with pytest.raises(fuse.ApiError) as info:
            next(c.events.follow(0, wait_s=1, reconnect_s=1.0))
    assert 1.0 <= time.monotonic() - t0 < 4 and len(tries) >= 3
    assert (info.value.status, info.value.code) == (0, "unreachable")
    assert isinstance(info.value.__cause__, httpx.ConnectError)


async def test_the_async_follow_gives_up_after_reconnect_s_with_an_api_error():
    tries: list[float] = []
    async with fuse.AsyncClient("http://c", transport=httpx.MockTransport(refusing(tries))) as c:
        t0 = time.monotonic()
        with pytest.raises(fuse.ApiError) as info:
            await c.events.follow(0, wait_s=1, reconnect_s=1.0).__anext__()
    assert 1.0 <= time.monotonic() - t0 < 4 and len(tries) >= 3
    assert (info.value.status, info.value.code) == (0, "unreachable")
    assert isinstance(info.value.__cause__, httpx.ConnectError)


def test_follow_does_not_retry_an_answer():
    """A controller that answers no (400, say) is not a lost connection."""
    asked = []

    def handle(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        return httpx.Response(400, json={"error": {"code": "invalid_argument", "message": "since must be >= 0"}})

    with fuse.Client("http://c", transport=httpx.MockTransport(handle)) as c:
        with pytest.raises(fuse.ApiError) as info:
            next(c.events.follow(-1))
    assert info.value.code == "invalid_argument" and len(asked) == 1


def test_an_ordinary_call_to_a_controller_that_is_not_there_is_an_api_error(tmp_path):
    with fuse.Client(f"unix://{tmp_path}/nothing.sock") as c:
        with pytest.raises(fuse.ApiError) as info:
            c.hosts.list()
    assert (info.value.status, info.value.code) == (0, "unreachable")
    assert f"unix://{tmp_path}/nothing.sock" in info.value.message
    assert isinstance(info.value.__cause__, httpx.TransportError)


async def test_an_ordinary_async_call_to_a_controller_that_is_not_there_is_an_api_error(tmp_path):
    async with fuse.AsyncClient(f"unix://{tmp_path}/nothing.sock") as c:
        with pytest.raises(fuse.ApiError) as info:
            await c.vms.list()
    assert (info.value.status, info.value.code) == (0, "unreachable")
    assert isinstance(info.value.__cause__, httpx.TransportError)


@pytest.mark.parametrize("side", ["sync", "async"])
def test_a_controller_that_hangs_ends_the_follow_reconnect_s_after_its_answer_was_due(tmp_path, side):
    """A frozen controller (SIGSTOP) takes the connection but never answers: the follow's
    failure is counted from when the long poll's answer was due (wait_s past its start),
    and the tries after it are short, so it ends about GRACE_S + reconnect_s after that,
    not after a second long poll's full timeout (it had taken 62 s for wait_s 1,
    reconnect_s 5; ~120 s with the defaults)."""
    import os
    import signal

    from fuse.client.events import GRACE_S

    ctl = start_controller(tmp_path)
    os.kill(ctl.popen.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(fuse.ApiError) as info:
            if side == "sync":
                with fuse.Client(ctl.url) as c:
                    next(c.events.follow(10 ** 9, wait_s=1, reconnect_s=5))
            else:
                async def go():
                    async with fuse.AsyncClient(ctl.url) as c:
                        await c.events.follow(10 ** 9, wait_s=1, reconnect_s=5).__anext__()
                asyncio.run(go())
        took = time.monotonic() - t0
    finally:
        os.kill(ctl.popen.pid, signal.SIGCONT)
        ctl.stop()
    assert (info.value.status, info.value.code) == (0, "unreachable")
    assert 1 + GRACE_S - 1 <= took < 1 + GRACE_S + 5 + 3, took


def db_away_then_back(tries: list[float], away: int = 3):
    """A controller that cannot reach its database for its first ``away`` answers (503
    db_unavailable), then has one event."""
    def handle(request: httpx.Request) -> httpx.Response:
        tries.append(time.monotonic())
        if len(tries) <= away:
            return httpx.Response(503, json={"error": {"code": "db_unavailable", "message": "the controller cannot "
                                                       "reach its database (OperationalError); try again"}})
        return httpx.Response(200, json={"events": [{"id": 1, "time": 1.0, "type": "host_added", "host": "h"}],
                                         "next_cursor": 1})
    return handle


def test_the_follow_carries_on_through_a_controller_whose_database_is_away_for_a_moment():
    """(review 22: both follows, and so `fuse controller events`, ended at the first 503)"""
    tries: list[float] = []
    with fuse.Client("http://c", transport=httpx.MockTransport(db_away_then_back(tries))) as c:
        assert next(c.events.follow(0, wait_s=1, reconnect_s=10.0))["id"] == 1
    assert len(tries) == 4


async def test_the_async_follow_carries_on_through_a_controller_whose_database_is_away_for_a_moment():
    tries: list[float] = []
    async with fuse.AsyncClient("http://c", transport=httpx.MockTransport(db_away_then_back(tries))) as c:
        assert (await c.events.follow(0, wait_s=1, reconnect_s=10.0).__anext__())["id"] == 1
    assert len(tries) == 4
