"""A registration settles what old moves left on the host in the background; a failure of that
pass (the store away, say) was an unretrieved task exception: asyncio's "Task exception was never
retrieved" with a traceback, once per registration. It is one line in the log now."""

from __future__ import annotations

import asyncio
import logging

from fuse.controller.service import Controller


async def test_a_failed_settle_of_old_moves_is_one_log_line_not_an_unretrieved_exception(
        tmp_path, monkeypatch, caplog):
    ctl = Controller(tmp_path / "ctl")
    unretrieved = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: unretrieved.append(ctx))

    async def store_away(host_id):
        raise RuntimeError("(psycopg.OperationalError) connection refused\nthe rest of the trace")

    monkeypatch.setattr(ctl.moves, "settle_strays", store_away)
    try:
        with caplog.at_level(logging.WARNING, logger="fuse.controller.moves"):
            ctl._settle_strays("h1")
            (task,) = ctl._strays
            await asyncio.wait_for(asyncio.shield(task), 5)
            assert task.exception() is None and not ctl._strays
        del task
        import gc
        gc.collect()  # (an unretrieved exception is reported when its task is collected)
        await asyncio.sleep(0)
        assert unretrieved == []
        (line,) = [r.getMessage() for r in caplog.records if "old moves" in r.getMessage()]
        assert "host h1" in line and "connection refused" in line and "the rest" not in line
    finally:
        ctl.store.close()
