"""Real VMs through the host API: boot, run the entry, report its exit,
refuse what does not fit, and leave no process behind."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from agent_support import COUNTER, qemu_pids

pytestmark = pytest.mark.qemu


async def test_entry_runs_and_its_exit_status_is_recorded(make_host):
    host = await make_host()
    r = await host.client.post("/v1/host/vms", json={
        "name": "echo", "shape": {"vcpus": 1, "mem_mib": 128},
        "entry": "echo hello-from-fuse; uname -r; exit 7"})
    assert r.status_code == 201, r.text
    vm = r.json()
    assert vm["state"] == "running" and vm["bundle"] == "linux" and len(vm["bundle_fingerprint"]) == 64
    assert vm["platform"]["accel"] in ("tcg", "kvm")

    vm = await host.wait_state("echo", {"exited", "failed"})
    assert vm["state"] == "exited", vm
    assert vm["exit_status"] == 7
    text = await host.console("echo")
    assert "hello-from-fuse" in text and "FUSE-EXIT 7" in text
    assert not qemu_pids(str(host.vms.vm_dir("echo")))

    # Tailing: from an offset the console returns only what follows.
    first = (await host.client.get("/v1/host/vms/echo/console", params={"offset": 0})).json()
    tail = (await host.client.get("/v1/host/vms/echo/console",
                                  params={"offset": first["next_offset"] - 10})).json()
    assert tail["text"] == first["text"][-10:] and tail["next_offset"] == first["next_offset"]

    events = (await host.client.get("/v1/host/events", params={"since": 0})).json()["events"]
    assert [e["to"] for e in events if e["type"] == "vm_state"] == ["creating", "running", "exited"]
    assert [e["id"] for e in events] == sorted(e["id"] for e in events)

    assert (await host.client.delete("/v1/host/vms/echo")).status_code == 204
    assert (await host.client.get("/v1/host/vms/echo")).status_code == 404
    assert not host.vms.vm_dir("echo").exists()


@pytest.mark.parametrize("entry, expected", [
    ("echo FUSE-EXIT 0; echo c > /proc/sysrq-trigger", ("failed", None)),
    ("echo FUSE-EXIT 0; exit 3", ("exited", 3)),
], ids=["an entry that prints the mark and crashes the guest failed", "the init's own mark, not the entry's, is the status"])
async def test_an_entry_that_prints_the_exit_mark_itself_does_not_set_its_exit_status(make_host, entry, expected):
    """Found by a black-box review of issue 3: the last "FUSE-EXIT n" line on the console
    was the status, whoever wrote it, so a guest that printed "FUSE-EXIT 0" and then crashed
    was recorded exited 0. The init's mark carries this boot's nonce (fuse_nonce=)."""
    host = await make_host()
    r = await host.client.post("/v1/host/vms", json={"name": "forger", "shape": {"vcpus": 1, "mem_mib": 128},
                                                     "entry": entry})
    assert r.status_code == 201, r.text
    nonce = r.json()["platform"]["exit_nonce"]
    assert len(nonce) == 16
    vm = await host.wait_state("forger", {"exited", "failed"}, timeout=120)
    assert (vm["state"], vm["exit_status"]) == expected, vm
    text = await host.console("forger")
    assert "\nFUSE-EXIT 0\n" in text.replace("\r", "")  # (the entry's line, there on the console)
    assert (f"FUSE-EXIT 3 {nonce}" in text) == (expected[0] == "exited"), text[-300:]


async def test_delete_of_a_running_vm_leaves_no_process_and_a_killed_vm_is_failed(make_host):
    host = await make_host()
    for name in ("a", "b"):
        r = await host.client.post("/v1/host/vms", json={
            "name": name, "shape": {"vcpus": 1, "mem_mib": 128}, "entry": COUNTER})
        assert r.status_code == 201, r.text
    # A taken name is refused while the first still runs.
    r = await host.client.post("/v1/host/vms", json={
        "name": "a", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "true"})
    assert (r.status_code, r.json()["error"]["code"]) == (409, "vm_exists")

    pid_a = (await host.client.get("/v1/host/vms/a")).json()["pid"]
    assert qemu_pids(str(host.vms.vm_dir("a"))) == [pid_a]
    assert (await host.client.delete("/v1/host/vms/a")).status_code == 204
    assert not qemu_pids(str(host.vms.vm_dir("a")))

    # Killed from outside: the agent notices and records why.
    os.kill((await host.client.get("/v1/host/vms/b")).json()["pid"], signal.SIGKILL)
    vm = await host.wait_state("b", {"failed", "exited"}, timeout=10)
    assert vm["state"] == "failed" and "without the guest reporting" in vm["reason"]
    # what only the live process used goes with it (a black-box review of issue 3 found the dead
    # pid's file and the QMP socket left in the failed VM's dir; a VM that exited leaves neither)
    left = sorted(p.name for p in host.vms.vm_dir("b").iterdir())
    assert not {"qemu.pid", "qmp.sock"} & set(left), left
    summary = host.vms.summary()
    assert summary["vm_count"] == 0 and summary["free_mem_mib"] == 4096 - 256


async def test_concurrent_creates_never_overcommit_memory(make_host):
    # 1024 - 256 reserve = 768 MiB free: room for one 512 MiB VM, not two.
    host = await make_host(ram_mb=1024)
    ask = {"shape": {"vcpus": 1, "mem_mib": 512}, "entry": "sleep 30"}
    replies = await asyncio.gather(*[
        host.client.post("/v1/host/vms", json={"name": f"c{i}", **ask}) for i in range(3)])
    codes = sorted((r.status_code, r.json().get("error", {}).get("code")) for r in replies)
    assert codes == [(201, None), (409, "host_full"), (409, "host_full")], [r.text for r in replies]
    refusal = next(r for r in replies if r.status_code == 409).json()["error"]["message"]
    assert "not enough memory" in refusal and "512 MiB" in refusal
    assert host.vms.summary()["free_mem_mib"] == 1024 - 256 - 512
    refused = (await host.client.get("/v1/host/events", params={"since": 0})).json()["events"]
    assert sum(e["type"] == "admission_refused" for e in refused) == 2


async def test_kvm_is_used_only_when_a_boot_probe_proves_it(tmp_path, bundle_dir):
    from fuse.agent.backends.qemu import QemuBackend
    from fuse.agent.bundle import get_bundle
    from fuse.agent.probe import kvm_device_answers

    b = get_bundle(bundle_dir.parent.parent, "linux")
    assert await QemuBackend(tmp_path).probe_accel(b, kvm_answers=False) == "tcg"
    assert not (tmp_path / "accel.json").exists()  # nothing to cache: no boot was tried

    if not kvm_device_answers():
        pytest.skip("no /dev/kvm here: the boot probe has nothing to try")
    backend = QemuBackend(tmp_path)
    accel = await backend.probe_accel(b, kvm_answers=True)
    # On a nested PVM KVM (these CI machines) the stock kernel cannot boot: tcg.
    assert accel in ("kvm", "tcg") and backend.platform()["accel"] == accel
    assert f'"accel": "{accel}"' in (tmp_path / "accel.json").read_text()
    assert await QemuBackend(tmp_path).probe_accel(b, kvm_answers=True) == accel  # cached


async def test_the_kvm_probe_answer_is_shared_by_every_agent_on_the_machine(tmp_path, bundle_dir, monkeypatch):
    """One probe per machine, QEMU and bundle: a second state dir reads the
    machine's cache instead of spinning a core for up to 10 s again."""
    from fuse.agent.backends.qemu import QemuBackend
    from fuse.agent.bundle import get_bundle

    monkeypatch.setenv("FUSE_CACHE_DIR", str(tmp_path / "cache"))
    b = get_bundle(bundle_dir.parent.parent, "linux")
    probes = []
    monkeypatch.setattr(QemuBackend, "_boot_probe", lambda self, bundle: probes.append(bundle) or False)
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    assert await QemuBackend(tmp_path / "one").probe_accel(b, kvm_answers=True) == "tcg"
    assert await QemuBackend(tmp_path / "two").probe_accel(b, kvm_answers=True) == "tcg"
    assert len(probes) == 1 and (tmp_path / "two" / "accel.json").exists()
    monkeypatch.setenv("FUSE_CACHE_DIR", "off")
    (tmp_path / "three").mkdir()
    await QemuBackend(tmp_path / "three").probe_accel(b, kvm_answers=True)
    assert len(probes) == 2  # no machine cache: the new state dir probes


async def test_free_memory_is_what_admission_would_take_on_the_real_machine(make_host):
    # a host whose books have more room than the machine has available reports the
    # machine's figure (less the reserve), which is where admission draws the line
    from fuse.agent.probe import mem_available_mb

    host = await make_host(backend="fake", ram_mb=10**8)
    free = host.vms.summary()["free_mem_mib"]
    assert abs(free - (mem_available_mb() - 256)) < 512
    r = await host.client.post("/v1/host/vms", json={"name": "over", "shape": {"vcpus": 1, "mem_mib": free + 1024},
                                                     "entry": "true"})
    assert (r.status_code, r.json()["error"]["code"]) == (409, "host_full")


async def test_a_console_offset_past_the_end_continues_from_the_end(make_host):
    host = await make_host(backend="fake")
    r = await host.client.post("/v1/host/vms", json={"name": "c", "shape": {"vcpus": 1, "mem_mib": 128},
                                                     "entry": "echo hi"})
    assert r.status_code == 201, r.text
    size = (host.vms.vm_dir("c") / "console.log").stat().st_size if (host.vms.vm_dir("c") / "console.log").exists() \
        else 0
    page = (await host.client.get("/v1/host/vms/c/console", params={"offset": 10**9})).json()
    assert page["text"] == "" and size <= page["next_offset"] < 10**9
