"""Review 31: on a machine under two names, a VM's usage rows name the name it ran under,
also once a newer VM of the same name runs there through the other name: the older rows
were reported under the newer VM's name (or the name asked), so a past window's rows
changed with a later, unrelated create."""

from __future__ import annotations

from test_aliases import agent_events, settle, shape, vm_ran

from support import wait_until


def _rows(client, vm: str) -> list[tuple[str, str]]:
    return sorted((r["created_at"], r["host"]) for r in client.usage()["vms"] if r["vm"] == vm)


def _deleted(client, vm: str, n: int) -> bool:
    return sum(1 for e in agent_events(client) if e.get("vm") == vm and e.get("to") == "deleted") >= n


def test_each_vm_of_a_reused_name_keeps_the_name_it_ran_under(fleet):
    a = fleet.agent("a1")
    fleet.add("h2", a)
    fleet.add("h2b", a)
    c = fleet.client
    c.vms.create(shape("x", host="h2b"))
    wait_until(lambda: vm_ran(c, "x"), what="the first x ran")
    c.vms.delete("x")
    wait_until(lambda: _deleted(c, "x", 1), what="the first x's delete read")
    c.vms.create(shape("x", host="h2"))
    wait_until(lambda: _deleted(c, "x", 1) and len(_rows(c, "x")) == 2, what="the second x metered")
    settle()
    assert [host for _, host in _rows(c, "x")] == ["h2b", "h2"], _rows(c, "x")
    c.vms.delete("x")
    wait_until(lambda: _deleted(c, "x", 2), what="the second x's delete read")
    c.vms.create(shape("x", host="h2b"))  # a third, through the first name again
    wait_until(lambda: len(_rows(c, "x")) == 3, what="the third x metered")
    settle()
    assert [host for _, host in _rows(c, "x")] == ["h2b", "h2", "h2b"], _rows(c, "x")
    c.vms.delete("x")
