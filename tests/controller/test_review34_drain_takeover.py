"""A drain asked through replica a, which stalls (a frozen process) past its lease while
replica b takes the drain over: a's caller gets the drain's report once b's drain ends (b's,
with what a had moved before), not a bare 500 with a CancelledError traceback in a's log
(review 34: renew_drains cancelled the drain task its caller awaited)."""

from __future__ import annotations

import signal
import threading

import pytest

import fuse
from support import Proxy, agent_states, reap, start_agent, start_controller, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]


def _register(client: fuse.Client, host_id: str, url: str, token: str) -> None:
    client.hosts.register(fuse.RegisterHostRequest(id=host_id, url=url, token=token, backend="qemu",
                                                   capacity=fuse.HostCapacity(vm_count=10, ram_mb=8192, cpus=4)))


def _drain_in_thread(client: fuse.Client, host_id: str, out: dict) -> threading.Thread:
    def drain() -> None:
        try:
            out["report"] = client.hosts.drain(host_id)
        except fuse.ApiError as err:
            out["error"] = err

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    return t


def test_the_caller_of_a_drain_another_replica_took_over_gets_its_report(tmp_path, postgres):
    """a stalls with its first move held; b takes the move and the drain over and ends the drain
    before a runs again: a's caller gets b's report (all three moved), no 500."""
    url = postgres.create_db("fuse_review34_drain_takeover")
    old, new = (start_agent(tmp_path, backend="fake", name=n) for n in ("old", "new"))
    # (a holds its first move at slept: the drain is mid-way when a is frozen)
    a = start_controller(tmp_path, db=url, name="ctl-a", env={"FUSE_TEST_PAUSE_AT": "slept:8"})
    b = start_controller(tmp_path, db=url, name="ctl-b")
    procs = [old, new, a, b]
    try:
        with fuse.Client(a.url) as ca, fuse.Client(b.url) as cb:
            for host_id, agent in (("old", old), ("new", new)):
                _register(ca, host_id, agent.url, agent.token)
            wait_until(lambda: len(cb.hosts.list()) == 2 and all(h.connected for h in cb.hosts.list()),
                       timeout=30, what="both hosts connected on b")
            for n in ("a", "b", "c"):
                ca.vms.create(name=n, host="old", shape={"vcpus": 1, "mem_mib": 1024}, entry="count")
            out: dict[str, object] = {}
            caller = _drain_in_thread(ca, "old", out)
            wait_until(lambda: "test hook: held at slept" in a.logs(), timeout=60, what="a's first move held")
            a.popen.send_signal(signal.SIGSTOP)
            try:
                wait_until(lambda: [e for e in cb.events.list(0, limit=500)["events"]
                                    if e["type"] == "host_drain_report"], timeout=120,
                           what="b to take the drain over and end it")
            finally:
                a.popen.send_signal(signal.SIGCONT)
            _all_moved_in_the_callers_report(caller, 90, out, a, old, new)
    finally:
        for p in procs:
            p.stop()
        reap(tmp_path)


def test_a_caller_waits_for_the_drain_of_the_replica_that_took_it_over_and_gets_what_both_moved(tmp_path, postgres):
    """a moves vm a, then stalls while the sleep of vm b is held at old's proxy; b takes the drain
    over and is still moving b and c (their sleeps held too) when a runs again: a's caller waits
    for b's drain to end, and its report has all three (a's move of a, b's of b and c)."""
    url = postgres.create_db("fuse_review34_drain_wait")
    old, new = (start_agent(tmp_path, backend="fake", name=n) for n in ("old", "new"))
    proxy = Proxy(int(old.url.rsplit(":", 1)[1]))
    a = start_controller(tmp_path, db=url, name="ctl-a")
    b = start_controller(tmp_path, db=url, name="ctl-b")
    procs = [old, new, a, b]
    try:
        with fuse.Client(a.url) as ca, fuse.Client(b.url) as cb:
            _register(ca, "old", proxy.url, old.token)
            _register(ca, "new", new.url, new.token)
            wait_until(lambda: len(cb.hosts.list()) == 2 and all(h.connected for h in cb.hosts.list()),
                       timeout=30, what="both hosts connected on b")
            for n in ("a", "b", "c"):
                ca.vms.create(name=n, host="old", shape={"vcpus": 1, "mem_mib": 1024}, entry="count")
            proxy.hold[b"POST /v1/host/vms/b/sleep "] = 3.0
            # (each under the agent's 5 s keep-alive: a connection idle that long it closes)
            proxy.hold[b"POST /v1/host/vms/c/sleep "] = 3.0
            out: dict[str, object] = {}
            caller = _drain_in_thread(ca, "old", out)
            wait_until(lambda: proxy.held >= 1, timeout=60, what="a's move of vm b held at old's proxy")
            a.popen.send_signal(signal.SIGSTOP)
            try:
                wait_until(lambda: "resuming its drain" in b.logs(), timeout=60, what="b to take the drain over")
            finally:
                a.popen.send_signal(signal.SIGCONT)
            assert not [e for e in cb.events.list(0, limit=500)["events"] if e["type"] == "host_drain_report"]
            _all_moved_in_the_callers_report(caller, 120, out, a, old, new)
    finally:
        proxy.close()
        for p in procs:
            p.stop()
        reap(tmp_path)


def _all_moved_in_the_callers_report(caller, wait: float, out: dict, a, old, new) -> None:
    """a's caller got a report (not an error) saying a, b and c moved from old, and they run on new."""
    caller.join(wait)
    assert not caller.is_alive(), "a's caller still waits"
    assert "error" not in out, out["error"]
    report = out["report"]
    assert sorted(m["vm"] for m in report["moved"]) == ["a", "b", "c"], report
    assert report["stuck"] == [] and report["host"] == "old", report
    assert sorted(agent_states(new)) == ["a", "b", "c"] and agent_states(old) == {}
    assert "CancelledError" not in a.logs() and "Exception in ASGI application" not in a.logs()
