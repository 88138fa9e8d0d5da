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


def _stop_me(after: float, secs: float) -> None:
    """SIGSTOP this process ``after`` seconds from now and SIGCONT it ``secs`` later (a helper does)."""
    import os
    import subprocess

    subprocess.Popen(["sh", "-c", f"sleep {after}; kill -STOP {os.getpid()}; sleep {secs}; kill -CONT {os.getpid()}"])


def test_a_stop_is_left_out_of_a_timer_and_a_peer_that_does_not_answer_is_still_cut():
    """On the loop itself: a stop (SIGSTOP, then SIGCONT) is left out of a timer's time; a wait for
    what never comes still ends after its limit of time the process ran."""
    async def main() -> tuple[float, float, int]:
        loop = asyncio.get_running_loop()
        start, mono = loop.time(), time.monotonic()
        never = loop.create_future()
        _stop_me(0.3, 2.0)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(never, 1.0)
        return loop.time() - start, time.monotonic() - mono, loop.clock.stalls

    from fuse import stalls

    ran, took, stalls_seen = stalls.run(main())
    assert stalls_seen >= 1
    assert 1.0 <= ran < 1.8, ran  # (its limit, of time the process ran)
    assert took >= 2.9, took  # (the 2 s stop on top)


def test_callbacks_that_hold_the_loop_do_not_stop_its_timers():
    """(the diff review: counted as stalls, turns of 1.2 s one after another kept every timer from
    coming due — a lease renewed each second went unrenewed for 12 s)"""
    async def main() -> tuple[list[float], float]:
        loop = asyncio.get_running_loop()
        renewals: list[float] = []

        async def renew():
            while True:
                renewals.append(time.monotonic())
                await asyncio.sleep(1)

        def hold():
            time.sleep(1.2)
            if time.monotonic() - began < 8:
                loop.call_soon(hold)

        began = time.monotonic()
        task = asyncio.ensure_future(renew())
        loop.call_soon(hold)
        never = loop.create_future()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(never, 3.0)
        waited = time.monotonic() - began
        await asyncio.sleep(0)
        task.cancel()
        return renewals, waited

    from fuse import stalls

    plain_renewals, plain_waited = asyncio.run(main())  # (asyncio's own loop, the same turns: the baseline)
    renewals, waited = stalls.run(main())
    assert waited < plain_waited + 2.5, (waited, plain_waited)  # (as late as the turns made it, no later)
    gaps = [b - a for a, b in zip(renewals, renewals[1:])]
    plain_gaps = [b - a for a, b in zip(plain_renewals, plain_renewals[1:])]
    assert gaps and max(gaps) < max(plain_gaps) + 2.5, (gaps, plain_gaps)


def test_a_stall_leaves_the_loop_clock_never_running_backwards():
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        seen = []

        def turn():
            seen.append(loop.time())
            time.sleep(1.3)
            seen.append(loop.time())

        loop.call_soon(turn)
        _stop_me(0.5, 1.5)
        await asyncio.sleep(2.5)
        seen.append(loop.time())
        return seen

    from fuse import stalls

    seen = stalls.run(main())
    assert seen == sorted(seen), seen
