"""Thirty-fourth session: the prewarm fill lease on PostgreSQL replicas. A replica that stalled
past the lease in the middle of a fill went on creating the standby VMs it had planned after
another replica had taken the lease and made them (a prewarm of 4 kept 7).

Real controllers on a throwaway PostgreSQL; a fake-backend agent behind a proxy that holds
each create a while (the fill is one create after another), so the holder is stopped with
its second create under way."""

from __future__ import annotations

import signal
import time

import psycopg
import pytest

import fuse
from support import Proxy, agent_vms, start_agent, start_controller, wait_until

pytestmark = pytest.mark.postgres

HOLD_S = 1.0  # each create's wait in the proxy: a create on a connection the controller kept (idle up to its 2 s
# keep-alive) reaches the agent up to 3 s after its last answer, well under the agent's 5 s keep-alive, which closes
# the proxy's upstream under a held create (at 3 s, and then 2 s, loaded full runs crossed it: the stalled
# replica's create failed "disconnected" before it could notice its lease was gone; the s34 keep-alive known issue)
COUNT = 4


def lease(url: str) -> dict:
    with psycopg.connect(url) as c:
        row = c.execute("SELECT value FROM settings WHERE key = 'prewarm_fill_lease'").fetchone()
    return row[0] if row else {}


def standby(agent, pw_id: str) -> list[str]:
    return sorted(n for n in agent_vms(agent) if n.startswith(pw_id + "-"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("env", [None, {"FUSE_PLACING_LEASE_S": "4"}], ids=["default", "placing-lease-4s"])
def test_a_fill_lease_holder_that_stalled_past_its_lease_creates_nothing_more(tmp_path, procs, postgres, env):
    # (with a placing lease of 4 s, b also takes over the stalled a's create under way, as a dead
    # replica's: a, going on, must neither record that VM over b's later read nor say `placed` twice)
    url = postgres.create_db("fuse_review34_fill_lease" + ("_4s" if env else ""))
    procs.append(agent := start_agent(tmp_path, backend="fake", name="a1"))
    proxy = Proxy(int(agent.url.rsplit(":", 1)[1]))
    procs.append(a := start_controller(tmp_path, db=url, name="ctl-a", env=env))
    try:
        with fuse.Client(a.url, timeout=120) as ca:
            ca.hosts.register(fuse.RegisterHostRequest(id="h1", url=proxy.url, token=agent.token, backend="qemu",
                                                       capacity=fuse.HostCapacity(vm_count=10, ram_mb=8192, cpus=8)))
            wait_until(lambda: ca.hosts.get("h1").connected, timeout=30, what="h1 connected")
            # a alone: its pool pass takes the lease, which it renews each second from then on
            holder = wait_until(lambda: lease(url).get("holder"), timeout=30, what="the fill lease taken")
            procs.append(b := start_controller(tmp_path, db=url, name="ctl-b", env=env))
            with fuse.Client(b.url, timeout=120) as cb:
                wait_until(lambda: cb.hosts.get("h1").connected, timeout=30, what="h1 connected to b")
                assert lease(url)["holder"] == holder  # (b waits: a holds it)

                proxy.hold[b"POST /v1/host/vms HTTP"] = HOLD_S
                pw = ca.pool.prewarm("linux", fuse.PrewarmOptions(count=COUNT, cpus=1, memory_mb=256, on="host:h1",
                                                                  ttl_secs=900))
                # its first create answered, its second under way (in the proxy): a stalls there
                wait_until(lambda: proxy.held >= 2, timeout=60, interval=0.02, what="a's second standby create")
                a.popen.send_signal(signal.SIGSTOP)
                try:
                    # past the lease b takes it and fills the prewarm to its count
                    wait_until(lambda: lease(url)["holder"] != holder, timeout=60, interval=0.5,
                               what="b taking the lease over")
                    wait_until(lambda: len(standby(agent, pw.id)) == COUNT, timeout=60, interval=0.5,
                               what=f"b filling {pw.id} to {COUNT}")
                finally:
                    a.popen.send_signal(signal.SIGCONT)
                # a goes on where it stalled: its create under way answers, and nothing more is made
                wait_until(lambda: ca.pool.prewarms(), timeout=30, what="a answering again")
                time.sleep(4 * HOLD_S)  # (the two creates a had still planned would have taken 2 * HOLD_S)
                got = standby(agent, pw.id)
                assert len(got) == COUNT, got  # (was: 6, the two a had still planned made after b's)
                # (b counts the one a's create made once its poller lists it: ready within seconds)
                wait_until(lambda: next(p for p in cb.pool.prewarms() if p.id == pw.id).ready == COUNT, timeout=30,
                           interval=0.5, what=f"b counting {COUNT} ready")
                assert len(standby(agent, pw.id)) == COUNT
                placed = [e["vm"] for e in cb.events.list(0, limit=500)["events"] if e["type"] == "placed"]
                assert sorted(placed) == sorted(set(placed)) and set(got) <= set(placed), placed
                assert "took over the prewarm fill lease" in a.logs()
                proxy.hold.clear()
                ca.pool.remove_prewarm(pw.id)
    finally:
        proxy.close()
