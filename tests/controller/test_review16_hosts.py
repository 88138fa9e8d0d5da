"""Registering hosts, from a sixteenth review: a probe reporting a figure no
machine has is not an agent's (502, nothing stored, where it was a 500 and a
row that failed every host read after); an http(s) address carrying a user,
password, query or fragment is refused before anything is dialled or stored,
and no message repeats a password; probed MIG profiles are held to the rule
declared ones are (the bad entries dropped, each with a warning); a finished
VM holds its host against a new url no more than against deregister; and
concurrent registrations of one id each get back the host as their own
request wrote it."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError

import fuse
from fuse.client._core import Call

from fuse import HostCapacity, RegisterHostRequest
from fuse.controller import hosts as registry
from fuse.controller.service import Controller
from fuse.controller.store import Store, engine_url
from fuse.transport.address import BadAddress, parse_address
from support import api_error, end_fake_vm, free_port, start_agent, wait_until
from test_registry import FACTS, impostor  # noqa: F401  (the fixture: something answering GET /v1/host)

SHAPE = {"vcpus": 1, "mem_mib": 128}
DECLARED = {"vm_count": 1, "cpus": 1, "ram_mb": 512, "storage_gb": 1}  # nothing left to probe


def host_added(client) -> list[dict]:
    return [e for e in client.events.list(0, limit=500)["events"] if e["type"] == "host_added"]


def vm_events(client, vm: str) -> list[dict]:
    return [e for e in client.events.list(0, limit=500)["events"] if e.get("vm") == vm]


def state_of(client, name: str) -> str | None:
    return next((v["state"] for v in client.vms.list() if v["name"] == name), None)


# ------------------------------------------------------------------ probed figures past 2^53

@pytest.mark.parametrize("field", ["cpus", "ram_mb", "storage_gb", "gpus"])
def test_a_probe_reporting_a_figure_above_2_to_the_53_is_not_an_agent_and_stores_nothing(client, impostor, field):
    impostor.body, impostor.content_type = json.dumps(FACTS | {field: 2**60}).encode(), "application/json"
    err = api_error(client.hosts.register, RegisterHostRequest(id="huge", url=impostor.url, token="t", backend="qemu",
                                                               capacity=HostCapacity(vm_count=1)))
    assert (err.status, err.code) == (502, "host_unreachable"), err
    assert err.message.startswith(f"{impostor.url} answered but is not a fuse agent: its reply to GET /v1/host "
                                  f"has no valid {field} (input should be less than or equal to "), err.message
    assert client.hosts.list() == [] and host_added(client) == []


async def test_a_record_that_does_not_validate_is_never_stored(tmp_path, monkeypatch):
    async def probe(url, token, tls):  # past the probe's own checks: the registry's last line
        return FACTS | {"cpus": 2**60}

    monkeypatch.setattr(registry, "probe_host", probe)
    store = Store(engine_url(None, tmp_path))
    try:
        with pytest.raises(ValidationError):
            await registry.HostRegistry(store).register(RegisterHostRequest(
                id="huge", url="http://127.0.0.1:1", capacity=HostCapacity(vm_count=1)))
        assert store.list_hosts() == [] and store.events_after(0) == []
    finally:
        store.close()


# ------------------------------------------------------------------ http(s) addresses

@pytest.mark.parametrize("addr,problem", [
    ("http://admin:s3cret@127.0.0.1:{port}", "http:// addresses take no user or password"),
    ("https://admin:s3cret@127.0.0.1:{port}", "https:// addresses take no user or password"),
    ("http://admin@127.0.0.1:{port}", "http:// addresses take no user or password"),
    ("http://127.0.0.1:{port}?x=1", "has no query or fragment"),
    ("http://127.0.0.1:{port}/agent?x=1", "has no query or fragment"),
    ("http://127.0.0.1:{port}#top", "has no query or fragment"),
], ids=["a user and password", "a user and password over https", "a user alone", "a query", "a path and a query",
        "a fragment"])
def test_an_http_address_with_userinfo_a_query_or_a_fragment_is_400_and_stores_nothing(client, addr, problem):
    addr = addr.format(port=free_port())
    # everything declared: an address that passed would register (unprobed) with a warning
    r = client._http.post("/v1/hosts", json={"id": "h", "url": addr, "token": "t", "backend": "qemu",
                                             "capacity": DECLARED})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument", r.text
    message = r.json()["error"]["message"]
    assert message.startswith("address ") and problem in message, message
    assert "s3cret" not in message
    assert client.hosts.list() == [] and host_added(client) == []


@pytest.mark.parametrize("addr", [
    "http://admin:s3cret@127.0.0.1:8090", "ssh://admin:s3cret@10.0.0.5", "http://admin:s3cret@127.0.0.1:99999",
    "ftp://admin:s3cret@10.0.0.5",
], ids=["refused for its password", "an ssh address refused for its password", "refused for its port",
        "refused for its scheme"])
def test_no_message_about_an_address_repeats_its_password(addr):
    with pytest.raises(BadAddress) as info:
        parse_address(addr)
    assert "s3cret" not in info.value.message and "admin:***@" in info.value.message, info.value.message


# ------------------------------------------------------------------ probed MIG profiles

def test_probed_mig_profiles_a_declared_one_could_not_be_are_dropped_with_a_warning_each(client, impostor):
    impostor.content_type = "application/json"
    impostor.body = json.dumps(FACTS | {"gpus": 1, "mig_profiles": {"bogus": 3, "1g.10gb": -3, "2g.20gb": 2}}).encode()
    host = client.hosts.register(RegisterHostRequest(id="mig", url=impostor.url, token="t", backend="qemu",
                                                     capacity=HostCapacity(vm_count=1)))
    assert host.capacity.mig_profiles == client.hosts.get("mig").capacity.mig_profiles == {"2g.20gb": 2}
    assert (host.capacity.cpus, host.capacity.gpus) == (FACTS["cpus"], 1)  # the host's other facts stand
    # the words a declared entry is refused with (one rule for both)
    assert [w for w in host.warnings if w.startswith("mig_profiles:")] == [
        f"mig_profiles: dropped the probed entry {name!r}: {count} ({registry.mig_entry_problem(name, count)})"
        for name, count in (("1g.10gb", -3), ("bogus", 3))]
    for name, count in (("bogus", 3), ("1g.10gb", -3)):
        err = api_error(client.hosts.register, RegisterHostRequest(
            id="declared", url=impostor.url, token="t", backend="qemu",
            capacity=HostCapacity(vm_count=1, mig_profiles={name: count})))
        assert (err.status, err.message) == (400, f"capacity.mig_profiles: {registry.mig_entry_problem(name, count)}")


# ------------------------------------------------------------------ a finished VM and a new url

@pytest.mark.parametrize("exit_status,finished", [(0, "exited"), (None, "failed")],
                         ids=["an exited vm does not hold its host", "a failed vm does not hold its host"])
def test_a_finished_vm_does_not_keep_its_host_from_moving_to_a_new_url(fleet, exit_status, finished):
    a1, a2 = fleet.agent("a1"), fleet.agent("a2")
    fleet.add("h1", a1)
    c = fleet.client
    for name in ("done1", "live1"):
        c.vms.create(name=name, shape=SHAPE, entry="python3 job.py", host="h1")
    wait_until(lambda: state_of(c, "done1") == state_of(c, "live1") == "running", what="vms running")
    end_fake_vm(a1, "done1", exit_status)
    wait_until(lambda: state_of(c, "done1") == finished, timeout=30, what=f"done1 {finished}")

    # a VM that holds a machine still does, and it is the one named, as for deregister
    err = api_error(fleet.add, "h1", a2)
    assert (err.status, err.code) == (409, "conflict")
    assert err.message == f"host h1 still has vm live1 assigned; it cannot move to {a2.url}"
    c.vms.delete("live1")
    history = vm_events(c, "done1")
    assert history and {e["host"] for e in history} == {"h1"}

    host = fleet.add("h1", a2)  # was 409 "host h1 still has vm done1 assigned"
    assert host.url == c.hosts.get("h1").url == a2.url
    assert [(e["host"], e["url"]) for e in host_added(c)] == [("h1", a1.url), ("h1", a2.url)]
    wait_until(lambda: c.hosts.get("h1").connected, what="h1 connected at its new url")
    # Another machine answers for h1 now: its VM list is h1's (done1's record stays on a1, as
    # when a deregister takes a finished VM along), and what done1 did stays h1's history.
    assert "done1" not in [v["name"] for v in c.vms.list()]
    assert vm_events(c, "done1") == history
    r = c._http.get("/v1/usage")
    assert r.status_code == 200 and r.json()["unreachable"] == [], r.text
    c.hosts.deregister("h1")


# ------------------------------------------------------------------ concurrent registrations

async def test_concurrent_registrations_of_one_id_each_get_the_host_their_own_request_wrote(tmp_path, procs):
    a1, a2 = (start_agent(tmp_path, backend="fake", name=n) for n in ("a1", "a2"))
    procs += [a1, a2]
    ctl = Controller(tmp_path / "ctl", poll_interval=0.2)
    await ctl.start()
    try:
        # each registration's poll waits until both have written: the first to answer
        # would otherwise read the row back before the other replaced it
        refresh, polled, both_wrote = ctl.fleet.refresh, [], asyncio.Event()

        async def refresh_once_both_wrote(host_id):
            polled.append(host_id)
            if len(polled) == 2:
                both_wrote.set()
            await asyncio.wait_for(both_wrote.wait(), 30)
            await refresh(host_id)

        ctl.fleet.refresh = refresh_once_both_wrote
        asks = {a1.url: (3, 1), a2.url: (5, 10**6)}  # url -> (vm_count, cpus: far above a2's probe, a warning)
        replies = await asyncio.gather(*(ctl.register_host(RegisterHostRequest(
            id="race", url=url, token="agent-token", backend="qemu",
            capacity=HostCapacity(vm_count=n, cpus=cpus))) for url, (n, cpus) in asks.items()))
        assert len(polled) == 2
        # (both agents run the fake backend: a "backend:" warning each, whoever wrote last)
        got = {h.url: (h.capacity.vm_count, h.capacity.cpus, [w for w in h.warnings if w.startswith("capacity.")])
               for h, _ in replies}
        assert got[a1.url] == (3, 1, [])
        assert got[a2.url][:2] == (5, 10**6) and [w.split(":")[0] for w in got[a2.url][2]] == ["capacity.cpus"]
        assert sorted(created for _, created in replies) == [False, True]
    finally:
        await ctl.close()


def test_the_hint_to_declare_capacity_names_the_fields_where_the_short_form_takes_them(tmp_path, procs):
    # "declare capacity cpus, ram_mb, storage_gb": a caller of the short form put them at the top
    # of the body, and got "unknown field cpus; ..."; they go in its capacity object
    from support import start_controller

    procs.append(ctl := start_controller(tmp_path))
    port = free_port()  # nothing listens there
    with fuse.Client(ctl.url) as client:
        with pytest.raises(fuse.ApiError) as e:
            client._send(Call("POST", "/v1/hosts", body={"name": "s", "addr": f"http://127.0.0.1:{port}"}))
        assert e.value.status == 502
        assert "declare capacity.cpus, capacity.ram_mb, capacity.storage_gb explicitly" in e.value.message
        host = client._send(Call("POST", "/v1/hosts", body={
            "name": "s", "addr": f"http://127.0.0.1:{port}",
            "capacity": {"cpus": 2, "ram_mb": 2048, "storage_gb": 10}}))  # as the hint says: registered
        assert host["name"] == "s" and host["warnings"]
