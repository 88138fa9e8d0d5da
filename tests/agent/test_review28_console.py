"""Twenty-eighth session: a console cut while the hypervisor prints loses nothing (review 28:
the agent read the tail, emptied the file and wrote the tail back while QEMU appended, so
lines printed meanwhile were lost or came before the notice, and a reader following the
log lost the lines it had not read yet at each cut)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time

from agent_support import fake_vm_with_a_small_console

LINES = 60_000
WRITER = r"""
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
for i in range(int(sys.argv[2])):
    os.write(fd, b"line-%d-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n" % i)
    if i % 50 == 0:
        time.sleep(0.001)  # (~2 MB/s: a reader reading as it goes keeps up, as `--follow` does)
"""


def _numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"line-(\d+)-a+\n", text)]


async def test_a_cut_while_the_hypervisor_prints_loses_no_line_for_the_file_or_a_reader(make_host):
    host, vm, path = await fake_vm_with_a_small_console(make_host, 1 << 18)
    # the fake VM's own counter prints into the log too, and a cut stops only the process it
    # takes for the hypervisor: a line it printed between a cut's truncate and its notice came
    # before the notice, the offsets restarted, and the reader skipped lines (a loaded machine
    # widened that moment). It is stopped; QEMU is a VM's only writer.
    os.kill(vm.pid, signal.SIGSTOP)
    path.write_bytes(b"")
    # a stand-in for QEMU: a process of its own appending to the log (the cut stops it)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(LINES)])
    own_pid, vm.pid = vm.pid, writer.pid
    seen, offset, cuts = [], 0, 0
    try:
        deadline = time.monotonic() + 120
        while True:
            assert time.monotonic() < deadline, "the writer did not finish"
            done = writer.poll() is not None
            before = path.stat().st_size
            host.vms._cap_console(vm)
            cuts += path.stat().st_size < before
            page = (await host.client.get("/v1/host/vms/chatty/console", params={"offset": offset})).json()
            seen.append(page["text"])
            if done and page["next_offset"] == offset:
                break
            offset = page["next_offset"]
            await asyncio.sleep(0)
    finally:
        vm.pid = own_pid
        os.kill(own_pid, signal.SIGCONT)
        writer.kill()
        writer.wait()
    assert cuts >= 3, cuts
    text = path.read_text()
    assert text.startswith("[fuse: ") and "bytes of earlier console output dropped" in text.split("\n", 1)[0]
    kept = _numbers(text)
    assert kept == list(range(kept[0], LINES)), "the file lost lines or has them out of order"
    # what the reader got: every line in order, but where a cut's notice says the part it had
    # still to read went (a reader that fell behind the part kept, on a loaded machine)
    parts = [_numbers(p) for p in re.split(r"\[fuse: \d+ bytes of earlier console output dropped[^\n]*\n",
                                            "".join(seen))]
    for part in parts:
        assert part == list(range(part[0], part[0] + len(part))) if part else True, "a line lost with no notice"
    read = [n for part in parts for n in part]
    assert read[0] == 0 and read[-1] == LINES - 1 and read == sorted(set(read)), "lines out of order or twice"
    assert len(parts) == 1 or len(read) > LINES // 2, len(read)


async def test_offsets_count_every_byte_printed_across_cuts_and_a_reader_behind_gets_the_notice(make_host):
    """Review 28 (the diff's review): an offset was mapped only while the file was shorter
    than it, so a reader read the wrong bytes once the log grew back past it, and one whose
    offset was below the new end lost what the cut dropped without a notice. Offsets now
    count every byte the guest printed (a cut's dropped bytes too): the same byte, or the
    notice."""
    host, vm, path = await fake_vm_with_a_small_console(make_host)
    # the fake VM's own counter would print into the log: it is stopped, and a quiet process
    # stands in for the hypervisor the cuts stop
    os.kill(vm.pid, signal.SIGSTOP)
    quiet = subprocess.Popen(["sleep", "60"])
    own_pid, vm.pid = vm.pid, quiet.pid
    try:
        async with host.vms.lock(vm.name):  # (the agent's own watch leaves a locked VM alone: the cuts are the test's)
            await _cuts_keep_offsets(host, vm, path)
    finally:
        vm.pid = own_pid
        os.kill(own_pid, signal.SIGCONT)
        quiet.kill()
        quiet.wait()


async def _cuts_keep_offsets(host, vm, path) -> None:
    line = b"line-%06d-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n"
    stream = b"".join(line % i for i in range(40000))  # what the guest printed, in order
    path.write_bytes(stream)
    host.vms._cap_console(vm)
    notice = path.read_bytes().split(b"\r\n", 1)[0] + b"\r\n"
    dropped = int(re.match(rb"\[fuse: (\d+) bytes", notice).group(1))

    async def read(offset: int) -> dict:
        return (await host.client.get("/v1/host/vms/chatty/console", params={"offset": offset})).json()

    # a reader behind, below the new end or past it: its unread part went, so the notice
    for behind in (100, len(path.read_bytes()) + 10):
        page = await read(behind)
        assert page["text"].encode().startswith(notice) and page["offset"] == dropped - len(notice), page["offset"]
    # the log grows back past the old offsets, and is cut again: a kept byte is the same byte
    more = b"".join(line % i for i in range(40000, 80000))
    with open(path, "ab") as f:
        f.write(more)
    stream += more
    for at in (dropped + 40, len(stream) - 2000):
        page = await read(at)
        assert page["offset"] == at and page["text"].encode() == stream[at:at + len(page["text"].encode())], at
    host.vms._cap_console(vm)
    page = await read(len(stream) - 2000)
    assert page["offset"] == len(stream) - 2000 and page["text"].encode() == stream[-2000:]
    page = await read(dropped + 40)  # (went with the second cut)
    assert page["text"].startswith("[fuse: ") and page["offset"] > dropped + 40  # (its notice: past what went)
    # the offsets travel with the log (a move copies it; an agent restarting reads it): its notice names them
    r = await host.client.post("/v1/host/vms", json={"name": "moved", "shape": {"vcpus": 1, "mem_mib": 128},
                                                     "entry": "sleep 600"})
    assert r.status_code == 201, r.text
    moved = host.vms.vm_dir("moved") / "console.log"
    os.kill(host.vms.get("moved").pid, signal.SIGSTOP)  # (its own counter would print into it)
    moved.write_bytes(path.read_bytes())
    at = len(stream) - 2000
    page = (await host.client.get("/v1/host/vms/moved/console", params={"offset": at})).json()
    assert page["offset"] == at and page["text"].encode() == stream[at:]


async def test_a_hypervisor_someone_else_stopped_is_not_cut_nor_continued(make_host):
    host, vm, path = await fake_vm_with_a_small_console(make_host)
    path.write_bytes(b"x" * (2 << 20))
    with a_stopped_process() as stopped:
        own_pid, vm.pid = vm.pid, stopped.pid
        try:
            host.vms._cap_console(vm)
        finally:
            vm.pid = own_pid
        assert path.stat().st_size >= 2 << 20  # (not cut: a later tick, once it runs)
        assert _state(stopped.pid) in ("T", "t")


def test_a_hypervisor_the_last_agent_stopped_for_a_cut_is_continued_by_the_next(tmp_path):
    from fuse.agent.vms import TRIMMING, _resume_after_cut

    with a_stopped_process() as p:
        (marker := tmp_path / TRIMMING).write_text(str(p.pid))
        _resume_after_cut(p.pid, marker)
        deadline = time.monotonic() + 10
        while _state(p.pid) in ("T", "t"):
            assert time.monotonic() < deadline, "still stopped"
            time.sleep(0.01)
        assert not marker.exists()


def test_a_hypervisor_stopped_by_someone_else_is_left_as_it_is(tmp_path):
    from fuse.agent.vms import TRIMMING, _resume_after_cut

    with a_stopped_process() as p:
        _resume_after_cut(p.pid, tmp_path / TRIMMING)  # no marker: not ours to continue
        time.sleep(0.1)
        assert _state(p.pid) in ("T", "t")


@contextlib.contextmanager
def a_stopped_process():
    """A process of its own (``sleep 60``) stopped with SIGSTOP, as a hypervisor stopped by
    someone else or by a cut; killed after."""
    p = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(p.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while _state(p.pid) not in ("T", "t"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield p
    finally:
        p.kill()
        p.wait()


def _state(pid: int) -> str:
    return open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0]
