"""A controller or an agent that itself did not run for a while (SIGSTOP, its VM paused or
live-migrated, a debugger) counts that time against no peer: from review 36, a controller stopped
~12 s with a registration's probe out failed it "nothing came back within 10 s" though the agent
had answered in a second, and an agent stopped while it waited for a QEMU's QMP greeting failed
the sleep ``sleep_failed`` "no greeting within 10 s" from a QEMU that had greeted. Their event
loops' clocks leave out the time the process did not run (``fuse.stalls``); a peer that really
does not answer is still cut after its limit."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest

import fuse
from support import Proxy, start_agent, start_controller, wait_until

pytestmark = pytest.mark.timeout(240)


def test_a_controller_stopped_while_its_probe_is_out_registers_the_host_that_answered(tmp_path):
    agent = start_agent(tmp_path, backend="fake", name="a1")
    proxy = Proxy(int(agent.url.rsplit(":", 1)[1]))
    proxy.hold[b"GET /v1/host"] = 1.0  # (the probe is surely out when the controller is stopped)
    ctl = start_controller(tmp_path)
    try:
        with fuse.Client(ctl.url) as c:
            out: dict[str, object] = {}

            def register() -> None:
                try:
                    out["host"] = c.hosts.register(fuse.RegisterHostRequest(
                        id="h1", url=proxy.url, token=agent.token, capacity=fuse.HostCapacity(vm_count=4)))
                except fuse.ApiError as err:
                    out["error"] = err

            t = threading.Thread(target=register, daemon=True)
            t.start()
            wait_until(lambda: proxy.held >= 1, timeout=30, what="the registration's probe held at the proxy")
            ctl.popen.send_signal(signal.SIGSTOP)
            try:
                time.sleep(12)  # (the agent answered after 1 s; the controller's limit is 10 s)
            finally:
                ctl.popen.send_signal(signal.SIGCONT)
            t.join(60)
            assert "error" not in out, out["error"]
            assert out["host"].id == "h1" and out["host"].capacity.cpus > 0, out
    finally:
        proxy.close()
        ctl.stop()
        agent.stop()


def test_a_peer_that_does_not_answer_is_still_cut_after_its_limit_of_run_time():
    """On the loop itself: a stall (here the loop blocked 1.5 s, as a stopped process's is) is
    left out of a timer's time; a wait for what never comes still ends after its limit."""
    async def main() -> tuple[float, float, bool]:
        loop = asyncio.get_running_loop()
        start, mono = loop.time(), time.monotonic()
        never = loop.create_future()
        loop.call_later(0.2, time.sleep, 1.5)  # (a turn of the loop that takes 1.5 s: a stall)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(never, 1.0)
        return loop.time() - start, time.monotonic() - mono, loop.clock.stalls > 0

    from fuse import stalls

    ran, took, stalled = stalls.run(main())
    assert stalled
    assert 1.0 <= ran < 1.5, ran  # (its limit, of time the loop ran)
    assert took >= 2.4, took  # (the 1.5 s stall on top)


def test_a_stall_leaves_the_loop_clock_never_running_backwards():
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        seen = []

        def turn():
            seen.append(loop.time())
            time.sleep(1.3)
            seen.append(loop.time())

        loop.call_soon(turn)
        await asyncio.sleep(0.1)
        seen.append(loop.time())
        return seen

    from fuse import stalls

    seen = stalls.run(main())
    assert seen == sorted(seen), seen
