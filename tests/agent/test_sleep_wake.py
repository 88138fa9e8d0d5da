"""Sleep and wake a counting guest; move it to a second host through the
incoming side of the host API, 4 MiB at a time."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal

import pytest

from agent_support import COUNTER, counted, qemu_pids

pytestmark = pytest.mark.qemu
CHUNK = 4 * 2**20


async def _counting(host, name="counter", upto=5):
    r = await host.client.post("/v1/host/vms", json={
        "name": name, "shape": {"vcpus": 1, "mem_mib": 128}, "entry": COUNTER})
    assert r.status_code == 201, r.text
    await host.wait_console(name, lambda t: len(counted(t)) >= upto)


def _continues(text: str, before: int) -> None:
    """The guest kept counting from where it was: no restart, no gap."""
    numbers = counted(text)
    assert text.count("FUSE-ENTRY-START") == 1, "the guest rebooted"
    assert numbers == list(range(len(numbers))), numbers
    assert len(numbers) > before + 2


async def test_a_sleeping_guest_wakes_where_it_stopped(make_host):
    host = await make_host()
    await _counting(host)
    r = await host.client.post("/v1/host/vms/counter/wake")  # running -> running: not in the table
    assert (r.status_code, r.json()["error"]["code"]) == (409, "conflict")

    vm = (await host.client.post("/v1/host/vms/counter/sleep")).json()
    assert vm["state"] == "sleeping" and vm["pid"] is None
    r = await host.client.post("/v1/host/vms/counter/sleep")  # sleeping -> sleeping: not either
    assert (r.status_code, r.json()["error"]["code"]) == (409, "conflict")
    assert not qemu_pids(str(host.vms.vm_dir("counter")))
    assert host.vms.summary()["free_mem_mib"] == 4096 - 256  # a sleeping vm holds no memory
    files = (await host.client.get("/v1/host/vms/counter/files")).json()["files"]
    assert [f["name"] for f in files] == ["state.bin"] and files[0]["size"] > 1_000_000

    # Read by range, as a move copies it, and check the advertised hash.
    digest, offset = hashlib.sha256(), 0
    while offset < files[0]["size"]:
        r = await host.client.get("/v1/host/vms/counter/files/state.bin",
                                  params={"offset": offset, "length": CHUNK})
        assert r.status_code == 200 and int(r.headers["x-file-size"]) == files[0]["size"]
        digest.update(r.content)
        offset += len(r.content)
    assert digest.hexdigest() == files[0]["sha256"]

    before = len(counted(await host.console("counter")))
    await asyncio.sleep(1)
    assert len(counted(await host.console("counter"))) == before  # asleep means no progress

    vm = (await host.client.post("/v1/host/vms/counter/wake")).json()
    assert vm["state"] == "running" and vm["files"] == []
    _continues(await host.wait_console("counter", lambda t: len(counted(t)) >= before + 5), before)

    usage = (await host.client.get("/v1/host/usage", params={"from": 0})).json()
    row = next(r for r in usage["vms"] if r["vm"] == "counter")
    assert row["state_bytes_written"] == files[0]["size"]
    assert row["cpu_seconds"] > 0 and row["wall_seconds"] > 1
    assert abs(row["mem_mib_seconds"] - 128 * row["wall_seconds"]) < 0.01
    assert usage["totals"]["state_bytes_written"] == files[0]["size"]


async def test_a_state_dir_given_relative_still_sleeps_and_wakes(make_host, tmp_path, monkeypatch):
    # QEMU runs daemonized, in /: the state files it saves and loads are named absolutely
    monkeypatch.chdir(tmp_path)
    host = await make_host("rel", relative=True)
    assert host.vms.state_dir.is_absolute()
    await _sleeps_and_wakes_counting(host)


async def test_a_marked_vm_wakes_only_for_its_move(make_host):
    host = await make_host()
    await _counting(host, upto=1)
    assert (await host.client.post("/v1/host/vms/counter/sleep", json={"move_id": "m1"})).json()["move_id"] == "m1"

    for body in ({}, {"move_id": "m2"}):
        r = await host.client.post("/v1/host/vms/counter/wake", json=body)
        assert (r.status_code, r.json()["error"]["code"]) == (409, "move_in_progress")
    r = await host.client.post("/v1/host/vms/counter/sleep", json={"move_id": "m2"})
    assert r.status_code == 409  # another move cannot take it over
    r = await host.client.delete("/v1/host/vms/counter")
    assert r.status_code == 409  # nor can it be deleted behind the move's back

    vm = (await host.client.post("/v1/host/vms/counter/wake", json={"move_id": "m1", "clear_mark": True})).json()
    assert vm["state"] == "sleeping" and vm["move_id"] is None and not vm["return_room"]
    assert host.vms.summary()["free_mem_mib"] == 4096 - 256  # unmarked: its room is free again
    assert (await host.client.post("/v1/host/vms/counter/wake")).json()["state"] == "running"


async def test_a_vm_moves_to_another_host_and_keeps_counting(make_host):
    src, dst = await make_host("src"), await make_host("dst", ram_mb=1024)
    await _counting(src)
    vm = (await src.client.post("/v1/host/vms/counter/sleep", json={"move_id": "mv1"})).json()
    before = len(counted(await src.console("counter")))
    # The source keeps the room of a copy sleeping for a move, so a failed
    # move can always wake it back home.
    assert (vm["move_role"], vm["return_room"], vm["reserved"]) == ("source", True, False)
    assert src.vms.summary()["free_mem_mib"] == 4096 - 256 - 128

    # A wrong fingerprint or platform is refused before anything is reserved.
    record = {k: vm[k] for k in ("name", "shape", "entry", "bundle", "bundle_fingerprint")}
    bad = await dst.client.post("/v1/host/incoming", json={
        "move_id": "bad", "vm": {**record, "bundle_fingerprint": "0" * 64}, "platform": vm["platform"],
        "files": vm["files"]})
    assert (bad.status_code, bad.json()["error"]["code"]) == (409, "bundle_mismatch")
    bad = await dst.client.post("/v1/host/incoming", json={
        "move_id": "bad", "vm": record, "platform": {**vm["platform"], "machine": "q35"}, "files": vm["files"]})
    assert (bad.status_code, bad.json()["error"]["code"]) == (409, "platform_mismatch")

    r = await dst.client.post("/v1/host/incoming", json={
        "move_id": "mv1", "vm": record, "platform": vm["platform"], "files": vm["files"]})
    assert r.status_code == 201, r.text
    assert dst.vms.summary()["free_mem_mib"] == 1024 - 256 - 128  # room reserved while copying
    listed = (await dst.client.get("/v1/host/incoming")).json()["incoming"]
    assert [(i["move_id"], i["state"], i["received_bytes"]) for i in listed] == [("mv1", "receiving", 0)]

    # every file it declared: its state and, for a move, its serial log so far
    assert [f["name"] for f in vm["files"]] == ["state.bin", "console.log"]
    for f in vm["files"]:
        # Copy the chunks in reverse order: offsets, not arrival order, place them.
        for offset in reversed(range(0, f["size"], CHUNK)):
            data = (await src.client.get(f"/v1/host/vms/counter/files/{f['name']}",
                                         params={"offset": offset, "length": CHUNK})).content
            r = await dst.client.put(f"/v1/host/incoming/mv1/files/{f['name']}", params={"offset": offset},
                                     content=data)
            assert r.status_code == 200, r.text
    installed = (await dst.client.post("/v1/host/incoming/mv1/install")).json()
    assert installed["state"] == "sleeping" and installed["move_id"] == "mv1" and installed["reserved"]
    assert installed["move_role"] == "target"
    assert dst.vms.summary()["free_mem_mib"] == 1024 - 256 - 128  # still reserved for the wake
    assert (await dst.client.get("/v1/host/incoming")).json()["incoming"][0]["state"] == "installed"

    woke = (await dst.client.post("/v1/host/vms/counter/wake", json={"move_id": "mv1"})).json()
    assert woke["state"] == "running" and woke["move_id"] is None
    assert (await src.client.delete("/v1/host/vms/counter", params={"move_id": "mv1"})).status_code == 204
    assert src.vms.summary()["free_mem_mib"] == 4096 - 256
    # The console moved with it (was: the destination log started after the move): the whole
    # count, on from where it slept
    await dst.wait_console("counter", lambda t: len(counted(t)) >= before + 3)
    numbers = counted(await dst.console("counter"))
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))) and len(numbers) >= before + 3


async def test_incoming_checks_hashes_and_abort_frees_everything(make_host):
    dst = await make_host(ram_mb=1024)
    data = b"fuse" * 1000
    files = [{"name": "state.bin", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]
    fp = dst.vms.summary()["bundles"][0]["fingerprint"]
    body = {"move_id": "m9", "vm": {"name": "v", "shape": {"vcpus": 1, "mem_mib": 700}, "entry": "true",
                                    "bundle": "linux", "bundle_fingerprint": fp},
            "platform": dst.vms.backend.platform(), "files": files}
    assert (await dst.client.post("/v1/host/incoming", json=body)).status_code == 201
    assert (await dst.client.post("/v1/host/incoming", json=body)).status_code == 201  # idempotent
    # The reservation counts: a create that would overcommit is refused.
    r = await dst.client.post("/v1/host/vms", json={"shape": {"vcpus": 1, "mem_mib": 128}, "entry": "true"})
    assert r.json()["error"]["code"] == "host_full"
    r = await dst.client.put("/v1/host/incoming/m9/files/state.bin", params={"offset": 3990}, content=b"x" * 20)
    assert r.status_code == 400  # past the declared size

    await dst.client.put("/v1/host/incoming/m9/files/state.bin", content=data[:-1] + b"!")
    r = await dst.client.post("/v1/host/incoming/m9/install")
    assert (r.status_code, r.json()["error"]["code"]) == (409, "checksum_mismatch")
    await dst.client.put("/v1/host/incoming/m9/files/state.bin", params={"offset": len(data) - 1},
                         content=data[-1:])
    assert (await dst.client.post("/v1/host/incoming/m9/install")).json()["state"] == "sleeping"

    for _ in range(2):  # abort after install frees the unwoken copy; twice is fine
        assert (await dst.client.delete("/v1/host/incoming/m9")).status_code == 204
    assert dst.vms.vms == {} and dst.vms.summary()["free_mem_mib"] == 1024 - 256
    assert (await dst.client.get("/v1/host/incoming")).json()["incoming"] == []
    assert not dst.vms.vm_dir("v").exists()


def _qemu_zombies() -> list[int]:
    """This process's children that ended and were never collected, QEMU's among them."""
    out = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        close = stat.rfind(b")")
        rest = stat[close + 2:].split()
        if rest[0] == b"Z" and int(rest[1]) == os.getpid() and stat[stat.find(b"(") + 1:close].startswith(b"qemu"):
            out.append(int(d))
    return out


async def test_no_launch_leaves_a_zombie_under_an_agent_that_reaps_its_orphans(make_host):
    # `fuse host serve` is the child subreaper (a VM's QEMU is collected when it ends, not
    # left to init); QEMU's -daemonize forks twice, and its middle process, re-parented to the
    # agent, stayed a zombie: one per create and per wake
    import ctypes

    from fuse.agent.backends.base import become_subreaper

    assert become_subreaper()
    try:
        host = await make_host()
        await _counting(host)
        assert (await host.client.post("/v1/host/vms/counter/sleep")).json()["state"] == "sleeping"
        assert (await host.client.post("/v1/host/vms/counter/wake")).json()["state"] == "running"
        assert _qemu_zombies() == []
        assert (await host.client.delete("/v1/host/vms/counter")).status_code == 204
        assert _qemu_zombies() == []
    finally:
        ctypes.CDLL(None, use_errno=True).prctl(36, 0, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER off again


async def test_sleeping_a_vm_whose_guest_just_exited_is_409_and_records_the_exit(make_host, monkeypatch):
    # The guest ended before the monitor looked (here it does not look at all): the
    # sleep finds no process, records the end as the monitor would, and refuses as it
    # refuses any ended VM, instead of a 500
    from fuse.agent import vms as vms_mod

    monkeypatch.setattr(vms_mod, "MONITOR_INTERVAL", 3600.0)
    host = await make_host()
    r = await host.client.post("/v1/host/vms", json={"name": "done", "shape": {"vcpus": 1, "mem_mib": 128},
                                                     "entry": "echo bye; exit 0"})
    assert r.status_code == 201, r.text
    deadline = asyncio.get_running_loop().time() + 60
    while qemu_pids(str(host.vms.vm_dir("done"))):
        assert asyncio.get_running_loop().time() < deadline, "the guest never powered off"
        await asyncio.sleep(0.05)
    assert host.vms.get("done").state == "running"  # not noticed yet

    r = await host.client.post("/v1/host/vms/done/sleep")
    assert (r.status_code, r.json()["error"]["code"]) == (409, "conflict"), r.text
    assert "is exited" in r.json()["error"]["message"]
    vm = (await host.client.get("/v1/host/vms/done")).json()
    assert (vm["state"], vm["exit_status"], vm["pid"]) == ("exited", 0, None)
    assert [e["to"] for e in host.vms.events.list() if e["type"] == "vm_state"] == ["creating", "running", "exited"]
    assert host.vms.metering._open_segment("done") is None  # metered to its end, as the monitor would
    r = await host.client.post("/v1/host/vms/done/sleep")
    assert (r.status_code, r.json()["error"]["code"]) == (409, "conflict")


async def test_a_guest_gone_in_the_middle_of_the_sleeps_qmp_exchange_is_409_not_500(make_host, monkeypatch):
    # QEMU ends while the sleep talks QMP to it (what a guest powering off at that moment
    # does): qemu.qmp's own errors (ExecInterruptedError, EOFError) come out as a backend
    # error, and with no process left the VM is recorded ended and the sleep refused
    from qemu.qmp import QMPClient

    host = await make_host()
    await _counting(host, upto=1)
    pid = host.vms.get("counter").pid
    real_execute = QMPClient.execute

    async def execute(self, cmd, *args, **kwargs):
        if cmd == "stop":
            os.kill(pid, signal.SIGKILL)
            while qemu_pids(str(host.vms.vm_dir("counter"))):
                await asyncio.sleep(0.01)
        return await real_execute(self, cmd, *args, **kwargs)

    monkeypatch.setattr(QMPClient, "execute", execute)
    r = await asyncio.wait_for(host.client.post("/v1/host/vms/counter/sleep"), 30)
    assert (r.status_code, r.json()["error"]["code"]) == (409, "conflict"), r.text
    vm = (await host.client.get("/v1/host/vms/counter")).json()
    assert vm["state"] == "failed" and "without the guest reporting" in vm["reason"]


async def test_a_qmp_session_whose_qemu_dies_raises_a_backend_error(make_host):
    from fuse.agent.backends.base import BackendError
    from fuse.agent.backends.qemu import qmp_path, qmp_session

    host = await make_host()
    await _counting(host, upto=1)
    pid = host.vms.get("counter").pid
    with pytest.raises(BackendError, match="QMP"):
        async with qmp_session(qmp_path(host.vms.vm_dir("counter"))) as qmp:
            os.kill(pid, signal.SIGKILL)
            while qemu_pids(str(host.vms.vm_dir("counter"))):
                await asyncio.sleep(0.01)
            await asyncio.wait_for(qmp.execute("query-status"), 10)


async def _sleeps_and_wakes_counting(host) -> None:
    """A counting guest sleeps, wakes and counts on from where it slept."""
    await _counting(host, upto=2)
    r = await host.client.post("/v1/host/vms/counter/sleep")
    assert r.status_code == 200 and r.json()["state"] == "sleeping", r.text
    before = len(counted(await host.console("counter")))
    assert (await host.client.post("/v1/host/vms/counter/wake")).json()["state"] == "running"
    _continues(await host.wait_console("counter", lambda t: len(counted(t)) >= before + 3), before)


async def test_a_state_dir_with_a_comma_in_its_path_boots_sleeps_and_wakes(make_host):
    # QEMU splits its option strings at commas: the state dir goes in with each doubled
    host = await make_host("c,d")
    assert "," in str(host.vms.state_dir)
    await _sleeps_and_wakes_counting(host)

    # Every option string naming a path under it, a standby VM's entry socket included.
    from dataclasses import replace

    from fuse.agent.backends.base import STANDBY_PLATFORM

    spec = host.vms.spec(host.vms.get("counter"))
    spec = replace(spec, platform={**spec.platform, **STANDBY_PLATFORM})
    argv = host.vms.backend.argv(spec)
    options = [a for a in argv[1:] if "," in a and not a.startswith("/")]
    assert options and all("c,d" not in a.replace(",,", "") for a in options), options


async def test_a_wake_from_a_truncated_state_file_fails_and_leaves_the_vm_asleep_with_no_socket(make_host):
    # (a black-box review of issue 3: the failed wake left a stale QMP socket in the VM's dir)
    host = await make_host()
    await _counting(host, upto=2)
    assert (await host.client.post("/v1/host/vms/counter/sleep")).json()["state"] == "sleeping"
    (state,) = host.vms.vm_dir("counter").rglob("state.bin")
    with open(state, "r+b") as f:
        f.truncate(state.stat().st_size // 2)
    r = await host.client.post("/v1/host/vms/counter/wake")
    assert (r.status_code, r.json()["error"]["code"]) == (500, "wake_failed"), r.text
    vm = (await host.client.get("/v1/host/vms/counter")).json()
    assert vm["state"] == "sleeping" and vm["pid"] is None
    assert not qemu_pids(str(host.vms.vm_dir("counter")))
    left = sorted(p.name for p in host.vms.vm_dir("counter").iterdir())
    assert not {"qemu.pid", "qmp.sock"} & set(left), left
