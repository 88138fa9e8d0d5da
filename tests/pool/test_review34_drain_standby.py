"""Thirty-fourth session: a drain of a host whose agent does not answer, with a prewarm's
standby VM on it. Real controller, fake-backend agents."""

from __future__ import annotations

import signal

import pytest

import fuse
from fuse.controller.moves.drain import STANDBY_STAYS
from support import start_agent, start_controller
from test_prewarm import ready
from test_review16_prewarm import register, standby_on


@pytest.mark.timeout(300)
def test_a_standby_vm_placed_again_but_not_deleted_on_an_unanswering_host_says_so(tmp_path, procs):
    """(review 33: the report said "its prewarm found no room for it on another host in time"
    while its replacement ran on the other host: the drained host had not answered the delete)"""
    agents = {n: start_agent(tmp_path, backend="fake", name=n) for n in ("a1", "a2")}
    procs += list(agents.values())
    procs.append(ctl := start_controller(tmp_path, env={"FUSE_DRAIN_STANDBY_WAIT_S": "20"}))
    with fuse.Client(ctl.url, timeout=240) as client:
        register(client, "own1", agents["a1"])
        register(client, "own2", agents["a2"])
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=256, on="local"))
        ready(client, pw.id, 1, timeout=60)
        (host,) = standby_on(client, pw.id)
        other = {"own1": "own2", "own2": "own1"}[host]
        (name,) = [v["name"] for v in client.vms.list() if v["name"].startswith(pw.id + "-")]
        stopped = agents["a1" if host == "own1" else "a2"]
        stopped.popen.send_signal(signal.SIGSTOP)
        try:
            report = client.hosts.drain(host)
        finally:
            stopped.popen.send_signal(signal.SIGCONT)
        assert standby_on(client, pw.id).get(other) == 1, client.vms.list()  # placed again there
        assert [(s["vm"], s["code"], s["reason"]) for s in report["stuck"]] == [(name, "standby", STANDBY_STAYS["left"])], report
