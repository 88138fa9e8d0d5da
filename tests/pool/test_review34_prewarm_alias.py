"""Thirty-fourth session: a machine registered under two names (one agent identity), cordoned
under one, while a prewarm's standby VM is listed under the other. Real controller,
fake-backend agents."""

from __future__ import annotations

import pytest

import fuse
from support import start_agent, start_controller, wait_until
from test_prewarm import events, ready
from test_review16_prewarm import register, standby_on

SHAPE = {"vcpus": 1, "mem_mib": 256}


@pytest.mark.timeout(180)
def test_a_machine_cordoned_under_one_name_gives_its_standby_vm_to_no_create_under_the_other(tmp_path, procs):
    """(review 34: the standby VM on m1 was counted ready and claimed by a create pinned to m1 while
    the machine was cordoned as m1b; with no standby VM there the same create was fleet_full)"""
    agents = {n: start_agent(tmp_path, backend="fake", name=n) for n in ("a1", "a2")}
    procs += list(agents.values())
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url, timeout=120) as client:
        register(client, "m1", agents["a1"])
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=256, on="local"))
        ready(client, pw.id, 1, timeout=60)
        assert standby_on(client, pw.id) == {"m1": 1}

        register(client, "m1b", agents["a1"])  # the same agent, under a second name
        wait_until(lambda: client.hosts.get("m1").agent_id and
                   client.hosts.get("m1b").agent_id == client.hosts.get("m1").agent_id,
                   timeout=30, what="m1 and m1b known as one machine")
        client.hosts.cordon("m1b")

        (p,) = client.pool.prewarms()
        assert (p.ready, [(x.host, x.ready) for x in p.placements]) == (0, [("m1", 0)]), p  # (was: 1 ready)
        with pytest.raises(fuse.ApiError) as got:  # as with no standby VM there (was: 201, the standby claimed)
            client.vms.create(name="job", host="m1", shape=SHAPE, entry="sleep 600")
        assert got.value.code == "fleet_full", got.value
        assert got.value.details["hosts"]["m1"] == "host is cordoned (as m1b: the same machine)", got.value.details
        assert standby_on(client, pw.id) == {"m1": 1}  # nothing else has room for it: it stays

        # a host that takes work: the refill places it there, as off a cordoned host, and a create claims it
        register(client, "m2", agents["a2"])
        wait_until(lambda: standby_on(client, pw.id) == {"m2": 1}, timeout=60, what="the standby VM moved to m2")
        ready(client, pw.id, 1, timeout=60)
        vm = client.vms.create(name="job", shape=SHAPE, entry="sleep 600")
        assert vm["host"] == "m2", vm
        (placed,) = [e for e in events(client, "placed") if e.get("vm") == "job"]
        assert placed.get("prewarmed", "").startswith(pw.id + "-"), placed

        client.hosts.uncordon("m1b")
        client.vms.delete("job")
        client.pool.remove_prewarm(pw.id)
