"""Background loops end when their service closes, even where Python 3.11's
``asyncio.wait_for`` drops the cancellation (it arrives in the same turn as the
result it waits for: CPython gh-86296). A controller's pool loop kept running
after ``close`` cancelled it, and the stop waited for it for good (a CI run's
teardown timed out on it)."""

from __future__ import annotations

import asyncio

import pytest

from fuse.controller.service import Controller
from fuse.tasks import cancel_and_wait, wait_event


async def test_a_task_that_lets_one_cancel_go_is_cancelled_until_it_ends():
    passes = []

    async def stubborn():
        while True:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                if not passes:  # (as a dropped cancellation: the loop goes on)
                    passes.append("dropped")
                    continue
                raise

    t = asyncio.create_task(stubborn())
    await asyncio.sleep(0.01)
    assert await asyncio.wait_for(cancel_and_wait([t]), 5) == set()
    assert t.cancelled() and passes == ["dropped"]


async def test_a_limit_returns_what_still_runs():
    deaf_for = [True]

    async def deaf():
        while True:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                if not deaf_for[0]:
                    raise

    t = asyncio.create_task(deaf())
    await asyncio.sleep(0)
    assert await cancel_and_wait([t], limit=0.3) == {t}
    assert not t.done()
    deaf_for[0] = False
    assert await cancel_and_wait([t], limit=5) == set() and t.cancelled()


async def test_wait_event_is_set_or_times_out_and_a_cancel_is_never_dropped():
    e = asyncio.Event()
    assert await wait_event(e, 0.05) is False
    asyncio.get_running_loop().call_later(0.02, e.set)
    assert await wait_event(e, 5) is True
    # the race wait_for loses: the event is set and the waiter cancelled in one turn
    accepted = 0
    for turns in range(4):
        e.clear()
        t = asyncio.create_task(wait_event(e, 5))
        await asyncio.sleep(0)
        e.set()
        for _ in range(turns):
            await asyncio.sleep(0)
        if t.cancel():  # (not ended yet: the cancel must go through)
            accepted += 1
            with pytest.raises(asyncio.CancelledError):
                await t
    assert accepted >= 1


@pytest.mark.parametrize("turns", range(4))
async def test_the_pools_loop_ends_on_close_when_woken_as_it_is_cancelled(tmp_path, turns):
    ctl = Controller(tmp_path / "ctl", poll_interval=0.2)
    await ctl.start()
    ctl.pool.interval = 30  # (its pass waits on its wake, as between passes)
    await asyncio.sleep(0.3)
    task = ctl.pool._task
    ctl.pool.wake()
    for _ in range(turns):
        await asyncio.sleep(0)
    # close cancels the loop first thing: here in the turn the wake's result reaches it
    closing = asyncio.create_task(ctl.close())
    done, _ = await asyncio.wait([closing], timeout=8)  # (wait, not wait_for: it cancels nothing)
    if not done:  # the stop hung on the loop: the test's own clean-up ends both
        task.cancel()
        await asyncio.wait([closing], timeout=5)
    assert done and task.done(), "the controller's close still waits for its pool loop"
