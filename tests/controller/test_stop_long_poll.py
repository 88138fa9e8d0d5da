"""A controller asked to stop (SIGTERM) while a client holds an events long poll open:
the poll answers at once and the controller exits in a moment. Found by a README audit:
the stop waited out the poll's wait_s (29 s), refusing connections meanwhile but still
holding its state dir, so a restart in that window exited 3."""

from __future__ import annotations

import signal
import threading
import time

import fuse
from support import start_controller, wait_until


def test_a_stop_is_not_held_up_by_an_open_events_long_poll(tmp_path):
    ctl = start_controller(tmp_path)
    answered: list[object] = []
    client = fuse.Client(ctl.url)
    cursor = client.events.list(0)["next_cursor"]

    def poll():
        try:
            answered.append(client.events.list(cursor, wait_s=30))
        except fuse.ApiError as err:
            answered.append(err)

    worker = threading.Thread(target=poll, daemon=True)
    worker.start()
    time.sleep(1.0)  # the poll is waiting
    assert answered == []
    asked = time.monotonic()
    ctl.popen.send_signal(signal.SIGTERM)
    try:
        ctl.popen.wait(20)
    finally:
        ctl.kill()  # (a no-op once it has exited)
    took = time.monotonic() - asked
    assert took < 5, f"the stop took {took:.1f} s"
    wait_until(lambda: answered, timeout=5, what="the long poll's answer")
    if isinstance(answered[0], dict):  # (or the connection closed under it: either way it ended)
        assert answered[0]["next_cursor"] == cursor and answered[0]["events"] == []
    client.close()
