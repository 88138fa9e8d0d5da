"""The SDK sends what it is given: fields beside a create's body join it (they were
dropped: a VM pinned to h2 and named went anywhere, unnamed), and an empty ``to`` or
``host`` reaches the controller, which refuses it as REST does (an empty ``to`` started
a move to a target the controller chose)."""

from __future__ import annotations

import asyncio

import pytest

import fuse
from fuse.models.vm import CreateVmRequest
from support import api_error

BODY = {"shape": {"vcpus": 1, "mem_mib": 128}, "entry": "sleep 600"}


def test_fields_beside_a_body_join_it_in_both_sdks(fleet):
    for h in ("h1", "h2"):
        fleet.add(h, fleet.agent(h))
    vm = fleet.client.vms.create(BODY, host="h2", name="pinned")
    assert (vm["name"], vm["host"]) == ("pinned", "h2")
    with pytest.raises(ValueError, match="name given both"):
        fleet.client.vms.create(BODY | {"name": "a"}, name="b")

    async def from_async():
        async with fuse.AsyncClient(fleet.ctl.url) as ac:
            return await ac.vms.create(CreateVmRequest.model_validate(BODY), host="h1", name="apinned")

    vm = asyncio.run(from_async())
    assert (vm["name"], vm["host"]) == ("apinned", "h1")
    assert sorted((v["name"], v["host"]) for v in fleet.client.vms.list()) == [("apinned", "h1"), ("pinned", "h2")]


def test_an_empty_target_or_host_is_refused_not_dropped(fleet):
    for h in ("h1", "h2"):
        fleet.add(h, fleet.agent(h))
    fleet.client.vms.create(BODY, host="h1", name="v")
    for call, args in ((fleet.client.moves.create, ("v",)), ):
        err = api_error(call, *args, to="")
        assert (err.status, err.code) == (400, "invalid_argument"), err
    assert fleet.client.moves.list() == []  # nothing moved
    assert api_error(fleet.client.vms.list, host="").code == "invalid_argument"
    assert api_error(fleet.client.vms.get, "v", host="").status in (400, 404)


def test_the_cli_shows_one_move_by_its_id(fleet):
    import json
    import subprocess

    from support import FUSE, wait_until

    for h in ("h1", "h2"):
        fleet.add(h, fleet.agent(h))
    fleet.client.vms.create(BODY, host="h1", name="v")
    move = fleet.client.moves.create("v", to="h2")
    wait_until(lambda: fleet.client.moves.get(move["id"])["state"] == "done", timeout=60, what="the move")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(FUSE + ["controller", "--url", fleet.ctl.url, "moves", *args], capture_output=True,
                              text=True, timeout=60)

    got = cli(move["id"], "--json")
    assert got.returncode == 0 and json.loads(got.stdout)["id"] == move["id"], got
    assert json.loads(got.stdout)["state"] == "done"
    got = cli("mv-nope")
    assert got.returncode == 1 and "not_found" in got.stderr, got
    assert [m["id"] for m in json.loads(cli("--json").stdout)] == [move["id"]]


def test_the_cli_lists_one_hosts_vms(fleet):
    import json
    import subprocess

    from support import FUSE

    for h in ("h1", "h2"):
        fleet.add(h, fleet.agent(h))
    fleet.client.vms.create(BODY, host="h1", name="one")
    fleet.client.vms.create(BODY, host="h2", name="two")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(FUSE + ["controller", "--url", fleet.ctl.url, "vms", *args], capture_output=True,
                              text=True, timeout=60)

    got = cli("--host", "h2", "--json")
    assert got.returncode == 0 and [v["name"] for v in json.loads(got.stdout)] == ["two"], got
    assert sorted(v["name"] for v in json.loads(cli("--json").stdout)) == ["one", "two"]
    got = cli("--host", "nope")
    assert got.returncode == 1 and "not_found" in got.stderr, got
