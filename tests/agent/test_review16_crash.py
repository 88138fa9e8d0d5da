"""An agent killed in the middle of a sleep or a wake (review 16): the next
agent finds the VM running (its QEMU adopted) or sleeping with its state
files, never lost or failed with a good state file.

The kill is simulated in-process at a precise step: the first agent's step
raises ``Crash`` (nothing after it runs, as after SIGKILL), its monitor is
stopped, and a fresh ``VmManager`` on the same state dir starts as a
restarted agent does."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import pytest

from agent_support import COUNTER, counted, install_bundle, qemu_pids
from fuse.agent.backends.qemu import STATE_FILE
from fuse.agent.bundle import sha256_file
from fuse.agent.vms import SLEEP_MARK, WAKE_MARK, VmManager
from fuse.models.vm import CreateVmRequest

pytestmark = pytest.mark.qemu


class Crash(BaseException):
    """The agent dies here (a BaseException: no handler of the agent's own runs)."""


async def _counting_vm(tmp_path, bundle_dir) -> tuple[VmManager, str]:
    state = tmp_path / "host"
    install_bundle(bundle_dir, state)
    mgr = VmManager(state, "qemu", ram_mb=2048, cpus=2)
    await mgr.start()
    await mgr.create(CreateVmRequest.model_validate(
        {"name": "c", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": COUNTER}))
    await _counts_past(mgr, 2)
    return mgr, state


async def _counts_past(mgr: VmManager, n: int, timeout: float = 60) -> list[int]:
    console = mgr.vm_dir("c") / "console.log"
    for _ in range(int(timeout / 0.05)):
        if len(seen := counted(console.read_text())) > n:
            return seen
        await asyncio.sleep(0.05)
    raise AssertionError(f"the guest never counted past {n}: {counted(console.read_text())}")


def _crash_at_transition(mgr: VmManager, to: str) -> None:
    """Kill the agent just before it records ``to``."""
    real = mgr.transition

    def transition(vm, state, reason=None):
        if state == to:
            raise Crash
        return real(vm, state, reason)

    mgr.transition = transition


async def _die(mgr: VmManager) -> None:
    """What SIGKILL leaves of an agent: nothing more runs or is written."""
    if mgr._monitor is not None:
        mgr._monitor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await mgr._monitor
    mgr.events.close()


async def _restart(state) -> VmManager:
    mgr = VmManager(state, "qemu", ram_mb=2048, cpus=2)
    await mgr.start()
    return mgr


def _crash_after_launch(mgr: VmManager) -> None:
    """Kill the agent as soon as the woken QEMU runs, while it may still be loading."""
    real = mgr.backend._launch

    async def launch(spec, incoming=None):
        await real(spec, incoming=incoming)
        raise Crash

    mgr.backend._launch = launch


@pytest.mark.parametrize("crash", [_crash_after_launch, lambda mgr: _crash_at_transition(mgr, "running")],
                         ids=["as its qemu launched", "before it was recorded running"])
async def test_an_agent_killed_waking_a_vm_adopts_the_woken_vm(tmp_path, bundle_dir, crash):
    first, state = await _counting_vm(tmp_path, bundle_dir)
    second = None
    try:
        await first.sleep("c")
        crash(first)
        with pytest.raises(Crash):
            await first.wake("c")
        await _die(first)
        (pid,) = qemu_pids(str(first.vm_dir("c")))

        second = await _restart(state)
        vm = second.get("c")
        assert (vm.state, vm.pid, vm.files) == ("running", pid, [])
        assert qemu_pids(str(second.vm_dir("c"))) == [pid]  # not killed as an orphan
        assert not (second.vm_dir("c") / "state").exists()  # stale once the record says running
        assert not (second.vm_dir("c") / WAKE_MARK).exists()
        before = len(counted((second.vm_dir("c") / "console.log").read_text()))
        seen = await _counts_past(second, before + 2)
        assert seen == list(range(len(seen)))  # it ran on from where it slept
        assert second.metering._open_segment("c") is not None
    finally:
        await (second or first).delete("c")
        await (second or first).close()


async def test_a_vm_whose_woken_qemu_died_with_the_agent_stays_sleeping_and_wakes(tmp_path, bundle_dir):
    first, state = await _counting_vm(tmp_path, bundle_dir)
    second = None
    try:
        await first.sleep("c")
        files = first.get("c").files
        _crash_at_transition(first, "running")
        with pytest.raises(Crash):
            await first.wake("c")
        await _die(first)
        for pid in qemu_pids(str(first.vm_dir("c"))):  # its QEMU went down with the host's agent
            os.kill(pid, signal.SIGKILL)
        while qemu_pids(str(first.vm_dir("c"))):
            await asyncio.sleep(0.05)

        second = await _restart(state)
        vm = second.get("c")
        assert (vm.state, vm.files) == ("sleeping", files)
        path = second.state_file("c", STATE_FILE)
        assert sha256_file(path) == files[0].sha256  # intact: it wakes from them
        await second.wake("c")
        assert second.get("c").state == "running"
        seen = await _counts_past(second, len(counted((second.vm_dir("c") / "console.log").read_text())) + 2)
        assert len(seen) > 2
    finally:
        await (second or first).delete("c")
        await (second or first).close()


async def test_a_sleep_the_agent_died_before_metering_is_metered_when_its_state_was_written(tmp_path, bundle_dir):
    """(review 29: metered at the restart that found it asleep: an agent down an hour moved the
    state's bytes an hour later, out of the usage window they were written in)"""
    first, state = await _counting_vm(tmp_path, bundle_dir)
    second = None
    try:
        def crash(*a, **k):
            raise Crash

        first.metering.state_written = crash  # (dies as it meters the write: the file is in place)
        with pytest.raises(Crash):
            await first.sleep("c")
        await _die(first)
        saved = first.vm_dir("c") / "state" / STATE_FILE
        await asyncio.sleep(1.0)  # (this restart comes after the write: the two times differ)
        second = await _restart(state)
        assert second.get("c").state == "sleeping"
        (w,) = [w for w in second.metering.writes if w["vm"] == "c"]
        assert (w["time"], w["bytes"]) == (saved.stat().st_mtime, saved.stat().st_size), w
    finally:
        await (second or first).delete("c")
        await (second or first).close()


@pytest.mark.parametrize("move_id", [None, "m-1"], ids=["a plain sleep", "a move's sleep"])
async def test_an_agent_killed_after_the_state_file_is_in_place_finds_the_vm_sleeping(tmp_path, bundle_dir, move_id):
    first, state = await _counting_vm(tmp_path, bundle_dir)
    second = None
    try:
        _crash_at_transition(first, "sleeping")
        with pytest.raises(Crash):
            await first.sleep("c", move_id=move_id)
        await _die(first)
        assert not qemu_pids(str(first.vm_dir("c")))
        saved = first.vm_dir("c") / "state" / STATE_FILE
        assert saved.is_file()

        second = await _restart(state)
        vm = second.get("c")
        assert (vm.state, vm.pid, vm.reason) == ("sleeping", None, None)
        log = second.vm_dir("c") / "state" / "console.log"  # (a move's sleep takes its serial log along)
        assert [(f.name, f.size, f.sha256) for f in vm.files] == \
            [(STATE_FILE, saved.stat().st_size, sha256_file(saved))] + \
            ([("console.log", log.stat().st_size, sha256_file(log))] if move_id else [])
        assert (vm.move_id, vm.move_role, vm.return_room) == \
            ((move_id, "source", True) if move_id else (None, None, False))
        assert second.metering._open_segment("c") is None  # not metered as running
        # its state's bytes metered once (review 29: the agent had metered them before it died,
        # and this restart metered them again)
        assert [w["bytes"] for w in second.metering.writes if w["vm"] == "c"] == [saved.stat().st_size]
        assert not (second.vm_dir("c") / SLEEP_MARK).exists()
        if move_id:
            await second.wake("c", move_id=move_id)
        else:
            await second.wake("c")
        before = len(counted((second.vm_dir("c") / "console.log").read_text()))
        seen = await _counts_past(second, before + 2)
        assert seen == list(range(len(seen)))  # it ran on from where it slept
    finally:
        await (second or first).delete("c")
        await (second or first).close()


def _crash_after_quit(mgr: VmManager, monkeypatch) -> None:
    """Kill the agent as soon as the sleeping VM's QEMU has quit."""
    from fuse.agent.backends import qemu

    real = qemu.wait_gone

    async def wait_gone(pid, marker, *args, **kwargs):
        await real(pid, marker, *args, **kwargs)
        raise Crash

    monkeypatch.setattr(qemu, "wait_gone", wait_gone)


def _crash_before_quit(mgr: VmManager, monkeypatch) -> None:
    """Kill the agent once the state is all written, before QEMU is told to quit."""
    import types

    from fuse.agent.backends import qemu

    def replace(src, dst):
        os.replace(src, dst)
        if str(dst).endswith(STATE_FILE):
            raise Crash

    monkeypatch.setattr(qemu, "os", types.SimpleNamespace(**{**vars(os), "replace": replace}))


async def _sleep_killed(crash, tmp_path, bundle_dir, monkeypatch) -> tuple[VmManager, object]:
    """A counting VM whose agent ``crash`` kills in the middle of its sleep."""
    first, state = await _counting_vm(tmp_path, bundle_dir)
    try:
        crash(first, monkeypatch)
        with pytest.raises(Crash):
            await first.sleep("c")
    except BaseException:
        await first.delete("c")
        await first.close()
        raise
    await _die(first)
    monkeypatch.undo()
    return first, state


async def _counts_on(mgr: VmManager) -> None:
    """The guest counts on from where it stopped, not from 0."""
    before = len(counted((mgr.vm_dir("c") / "console.log").read_text()))
    seen = await _counts_past(mgr, before + 2)
    assert seen == list(range(len(seen)))


async def test_an_agent_killed_as_qemu_quits_after_a_sleep_finds_the_vm_sleeping(tmp_path, bundle_dir, monkeypatch):
    """Review 17: the state file took its name only after QEMU was gone, so an
    agent killed in between left a partial file, which the next agent dropped,
    recording the VM ended: its saved guest lost."""
    first, state = await _sleep_killed(_crash_after_quit, tmp_path, bundle_dir, monkeypatch)
    second = None
    try:
        assert not qemu_pids(str(first.vm_dir("c")))
        second = await _restart(state)
        vm = second.get("c")
        saved = second.state_file("c", STATE_FILE)
        assert (vm.state, vm.pid) == ("sleeping", None)
        assert [(f.name, f.sha256) for f in vm.files] == [(STATE_FILE, sha256_file(saved))]
        await second.wake("c")
        await _counts_on(second)  # from where it slept
    finally:
        await (second or first).delete("c")
        await (second or first).close()


async def test_an_agent_killed_before_qemu_quits_adopts_the_vm_and_drops_the_state(tmp_path, bundle_dir, monkeypatch):
    """The state is whole but QEMU never got its quit: the guest runs on (adopted, continued),
    and the written state goes: a later sleep's crash must never find it as this one's."""
    first, state = await _sleep_killed(_crash_before_quit, tmp_path, bundle_dir, monkeypatch)
    second = None
    try:
        (pid,) = qemu_pids(str(first.vm_dir("c")))
        assert (first.vm_dir("c") / "state" / STATE_FILE).is_file()
        second = await _restart(state)
        vm = second.get("c")
        assert (vm.state, vm.pid) == ("running", pid)
        assert not (second.vm_dir("c") / "state").exists()
        assert not (second.vm_dir("c") / SLEEP_MARK).exists()
        await _counts_on(second)  # from where it was paused
    finally:
        await (second or first).delete("c")
        await (second or first).close()
