"""VMs through the controller, from review 28 (issue 4): a create whose best host lost the
bundle since the last poll (removed by hand, or a rebuild swapping it) was answered that
host's `400 invalid_argument`, though another host had the bundle and room. A host's
"no such bundle" is its refusal: the create goes to the next."""

from __future__ import annotations

import shutil

import pytest

import fuse
from support import Proxy, api_error, fake_bundle, start_agent, start_controller, wait_until


@pytest.fixture
def two_hosts(tmp_path):
    agents = [start_agent(tmp_path, backend="fake", name=f"a{i}") for i in (1, 2)]
    for a in agents:
        fake_bundle(a.state_dir, "other", "fake-other-1")
    proxy = Proxy(int(agents[0].url.rsplit(":", 1)[1]))  # (to hold t1's polls: its view stays as it was)
    ctl = start_controller(tmp_path)
    client = fuse.Client(ctl.url)
    for name, url, agent in (("t1", proxy.url, agents[0]), ("t2", agents[1].url, agents[1])):
        client.hosts.register(fuse.RegisterHostRequest(id=name, url=url, token=agent.token, backend="qemu",
                                                       capacity=fuse.HostCapacity(cpus=2, ram_mb=2048, vm_count=10)))
    wait_until(lambda: all(h.connected and any(b.get("name") == "other" for b in h.bundles)
                           for h in client.hosts.list()),
               what="both hosts list the bundle")
    yield client, proxy, agents
    client.close()
    ctl.stop()
    proxy.close()
    for a in agents:
        a.stop()


def test_a_host_without_the_bundle_it_listed_passes_the_create_to_the_next(two_hosts, tmp_path):
    client, proxy, agents = two_hosts
    spec = {"shape": {"vcpus": 1, "mem_mib": 128}, "entry": "x", "bundle": "other"}
    first = client.vms.create({"name": "v0", **spec})
    assert first["host"] == "t1"  # the tie goes to t1
    client.vms.delete("v0")
    proxy.hold[b"GET /v1/host HTTP"] = 4.0  # t1's next polls answer late: its view still lists "other"
    wait_until(lambda: proxy.held > 0, what="a poll of t1 held")
    shutil.move(str(agents[0].state_dir / "bundles" / "other"), str(tmp_path / "other.away"))
    vm = client.vms.create({"name": "v1", **spec})
    assert vm["host"] == "t2", vm
    # with no host left that has it, the answer is the bundle's 400, as when no host listed it
    shutil.move(str(agents[1].state_dir / "bundles" / "other"), str(tmp_path / "other.away2"))
    err = api_error(client.vms.create, {"name": "v2", **spec})
    assert (err.status, err.code) == (400, "invalid_argument") and "no host has bundle other" in err.message, err
