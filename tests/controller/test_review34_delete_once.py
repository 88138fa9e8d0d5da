"""Deletes of one VM at once (review 34), against a real agent (fake backend) behind a
loopback proxy that holds each delete a while, so every call has found the VM listed
before the host deletes it: the host deletes it for one call, which answers 204 and
writes the one vm_removed; the others, whose host no longer had it, are 404 not_found
(as a delete just after is) and write none. On one controller (SQLite), and across
replicas on one PostgreSQL store. Was: every call 204, each with its own vm_removed."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

import fuse
from support import Proxy, agent_vms, api_error, reap, start_agent, start_controller, wait_until

pytestmark = pytest.mark.timeout(180)

DELETE = b"DELETE /v1/host/vms/"


def _register(client, proxy, agent) -> None:
    client.hosts.register(fuse.RegisterHostRequest(id="h1", url=proxy.url, token=agent.token, backend="qemu",
                                                   capacity=fuse.HostCapacity(vm_count=8, ram_mb=2048, cpus=4)))


def _delete_at_once(urls: list[str], name: str) -> list[object]:
    """DELETE vm ``name`` through each of ``urls`` at once: each call's status (204, or the error's)."""
    out: dict[int, object] = {}

    def go(i: int) -> None:
        with fuse.Client(urls[i]) as c:
            try:
                c.vms.delete(name)
                out[i] = 204
            except fuse.ApiError as err:
                out[i] = (err.status, err.code, err.message)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(urls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [out.get(i) for i in range(len(urls))]


def _removed(client, name: str) -> list[int]:
    return [e["id"] for e in client.events.list(0, limit=500)["events"]
            if e["type"] == "vm_removed" and e.get("vm") == name]


def _check_once(answers: list[object], clients: list, agent, name: str) -> None:
    assert answers.count(204) == 1, answers
    losers = [a for a in answers if a != 204]
    assert all(a[:2] == (404, "not_found") for a in losers), answers
    assert all(f"vm {name} not found on host h1" in a[2] for a in losers), answers
    assert name not in agent_vms(agent)
    time.sleep(2)  # (every replica's poller has read the host again: nothing more comes)
    for c in clients:  # (the merged stream, as each replica serves it)
        assert len(_removed(c, name)) == 1, (_removed(c, name), answers)
        assert name not in {v["name"] for v in c.vms.list()}


def test_deletes_at_once_through_one_controller_remove_the_vm_once(tmp_path, procs):
    agent = start_agent(tmp_path, backend="fake", name="agent")
    procs.append(agent)
    proxy = Proxy(int(agent.url.rsplit(":", 1)[1]))
    ctl = start_controller(tmp_path)
    procs.append(ctl)
    try:
        with fuse.Client(ctl.url) as client:
            _register(client, proxy, agent)
            wait_until(lambda: client.hosts.get("h1").connected, timeout=30, what="h1 connected")
            client.vms.create(name="d1", shape={"vcpus": 1, "mem_mib": 128}, entry="sleep 600")
            proxy.hold[DELETE] = 1.5  # (the three calls all reach the host after each located the VM)
            answers = _delete_at_once([ctl.url] * 3, "d1")
            assert proxy.held == 3, proxy.held
            _check_once(answers, [client], agent, "d1")
            proxy.hold.clear()
            # a delete after them is 404 as before, and writes nothing
            err = api_error(client.vms.delete, "d1")
            assert (err.status, err.code) == (404, "not_found"), err
            assert len(_removed(client, "d1")) == 1
    finally:
        proxy.close()


@pytest.mark.postgres
def test_deletes_at_once_through_replicas_on_postgresql_remove_the_vm_once(tmp_path, postgres):
    url = postgres.create_db(f"r34_{uuid.uuid4().hex[:8]}")
    agent = start_agent(tmp_path, backend="fake", name="agent")
    proxy = Proxy(int(agent.url.rsplit(":", 1)[1]))
    ctls = [start_controller(tmp_path, db=url, name=f"ctl-{n}") for n in "abc"]
    clients = [fuse.Client(c.url) for c in ctls]
    try:
        _register(clients[0], proxy, agent)
        wait_until(lambda: all(c.hosts.get("h1").connected for c in clients), timeout=30,
                   what="h1 connected on every replica")
        clients[0].vms.create(name="d2", shape={"vcpus": 1, "mem_mib": 128}, entry="sleep 600")
        wait_until(lambda: all("d2" in {v["name"] for v in c.vms.list()} for c in clients), timeout=15,
                   what="d2 listed by every replica")
        proxy.hold[DELETE] = 1.5
        answers = _delete_at_once([c.url for c in ctls], "d2")
        assert proxy.held == 3, proxy.held
        _check_once(answers, clients, agent, "d2")
    finally:
        for c in clients:
            c.close()
        proxy.close()
        for p in (*reversed(ctls), agent):
            p.stop()
        reap(tmp_path)
