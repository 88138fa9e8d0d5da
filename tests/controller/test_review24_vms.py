"""Twenty-fourth session: what a create that failed to boot leaves on its host."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

import fuse
from fuse.agent.bundle import fingerprint
from support import Proxy, agent_vms, install_bundle, real_bundle_dir, start_agent, start_controller, wait_until


def renamed_bundle(state, name="mix", broken=False):
    """The real bundle as ``name``; ``broken``: its manifest matching its files, with a kernel
    QEMU cannot load (the agent lists it as usable; a create from it ends in 500 ``boot_failed``)."""
    install_bundle(real_bundle_dir(), state)
    d = state / "bundles" / name
    (state / "bundles" / "linux").rename(d)
    for f in ("vmlinux", "manifest.json"):  # (hard links to the cached bundle's: never written through)
        (d / f).rename(d / f"{f}.orig")
    m = json.loads((d / "manifest.json.orig").read_text()) | {"name": name}
    if broken:
        (d / "vmlinux").write_bytes(os.urandom(1 << 20))
        m["files"]["vmlinux"] = hashlib.sha256((d / "vmlinux").read_bytes()).hexdigest()
        m["fingerprint"] = fingerprint(m["files"])
    else:
        (d / "vmlinux.orig").rename(d / "vmlinux")
    (d / "manifest.json").write_text(json.dumps(m))
    for f in ("vmlinux.orig", "manifest.json.orig"):
        (d / f).unlink(missing_ok=True)


@pytest.mark.qemu
@pytest.mark.timeout(240)
def test_a_create_that_failed_to_boot_on_one_host_leaves_nothing_there(tmp_path, procs):
    """(was: the host kept the VM as `failed` while the controller placed it on the next host:
    the name was on two hosts, every later GET/DELETE 409 ambiguous_vm; with one host the
    answer was fleet_full and the name stayed taken there, a retry `vm_exists`)"""
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 is not installed")
    renamed_bundle(tmp_path / "bad", broken=True)
    renamed_bundle(tmp_path / "good")
    procs.append(bad := start_agent(tmp_path, backend="qemu", name="bad"))
    procs.append(good := start_agent(tmp_path, backend="fake", name="good"))
    procs.append(ctl := start_controller(tmp_path))
    shape = {"vcpus": 1, "mem_mib": 256}
    with fuse.Client(ctl.url) as client:
        client.hosts.register(fuse.RegisterHostRequest(  # the smaller: best fit tries it first
            id="bad", url=bad.url, token=bad.token, backend="qemu",
            capacity=fuse.HostCapacity(vm_count=4, ram_mb=1024, cpus=2)))
        wait_until(lambda: all(h.connected for h in client.hosts.list()), timeout=30, what="host connected")

        # one host: fleet_full saying why, and nothing left on it (a retry is refused the same way)
        for _ in range(2):
            with pytest.raises(fuse.ApiError) as got:
                client.vms.create(name="mx", bundle="mix", shape=shape, entry="sleep 600")
            assert got.value.code == "fleet_full", got.value
            assert "failed to boot" in json.dumps(got.value.details), got.value.details
            assert agent_vms(bad) == {}
        assert client.vms.list() == []

        client.hosts.register(fuse.RegisterHostRequest(
            id="good", url=good.url, token=good.token, backend="qemu",
            capacity=fuse.HostCapacity(vm_count=4, ram_mb=4096, cpus=2)))
        wait_until(lambda: all(h.connected for h in client.hosts.list()), timeout=30, what="hosts connected")
        vm = client.vms.create(name="mx", bundle="mix", shape=shape, entry="sleep 600")
        assert vm["host"] == "good"
        assert agent_vms(bad) == {}
        assert client.vms.get("mx")["host"] == "good"  # (was 409 ambiguous_vm)
        assert [(v["name"], v["host"]) for v in client.vms.list()] == [("mx", "good")]
        client.vms.delete("mx")
        assert agent_vms(good) == {}


def test_a_machine_cordoned_under_one_of_its_names_takes_no_vm_under_the_other(fleet):
    """(was: cordoning p1 left the machine open through p2: a create placed there)"""
    a = fleet.agent("a1")
    fleet.add("p1", a)
    fleet.add("p2", a)
    fleet.client.hosts.cordon("p1")
    for pin in (None, "p2"):
        with pytest.raises(fuse.ApiError) as got:
            fleet.client.vms.create(name="x", shape={"vcpus": 1, "mem_mib": 256}, entry="sleep 600",
                                    **({"host": pin} if pin else {}))
        assert got.value.code == "fleet_full", got.value
        assert got.value.details["hosts"]["p2"] == "host is cordoned (as p1: the same machine)"
    fleet.client.hosts.uncordon("p1")
    assert fleet.client.vms.create(name="x", host="p2", shape={"vcpus": 1, "mem_mib": 256},
                                   entry="sleep 600")["host"] == "p2"


class CreatedAs500(Proxy):
    """A proxy whose ``201 Created`` answers reach the controller as ``500``, body and all:
    a host that made the VM but answered as if it had failed."""

    def _pipe(self, src, dst, requests: bool) -> None:
        if requests:
            return super()._pipe(src, dst, requests)
        try:
            while data := src.recv(65536):
                if data.startswith(b"HTTP/1.1 201 Created\r\n"):
                    data = b"HTTP/1.1 500 Internal Server Error\r\n" + data[len(b"HTTP/1.1 201 Created\r\n"):]
                dst.sendall(data)
        except OSError:
            pass
        self._close(src)
        self._close(dst)


def test_a_vm_a_host_runs_though_it_answered_500_is_not_created_again_elsewhere(fleet):
    """A 5xx is no proof that nothing runs there: the controller asks the host before it tries
    the next one (else the VM would run on both)."""
    a1, a2 = fleet.agent("a1"), fleet.agent("a2")
    proxy = CreatedAs500(int(a1.url.rsplit(":", 1)[1]))
    try:
        fleet.client.hosts.register(fuse.RegisterHostRequest(  # the smaller: best fit tries it first
            id="h1", url=proxy.url, token=a1.token, backend="qemu",
            capacity=fuse.HostCapacity(vm_count=4, ram_mb=1024, cpus=2)))
        fleet.add("h2", a2)
        wait_until(lambda: all(h.connected for h in fleet.client.hosts.list()), timeout=30, what="hosts connected")
        vm = fleet.client.vms.create(name="once", shape={"vcpus": 1, "mem_mib": 256}, entry="sleep 600")
        assert vm["host"] == "h1" and vm["state"] == "running", vm
        assert list(agent_vms(a1)) == ["once"] and agent_vms(a2) == {}
        assert [(v["name"], v["host"]) for v in fleet.client.vms.list()] == [("once", "h1")]
    finally:
        proxy.close()
