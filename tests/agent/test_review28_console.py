"""Twenty-eighth session: a console cut while the hypervisor prints loses nothing (review 28:
the agent read the tail, emptied the file and wrote the tail back while QEMU appended, so
lines printed meanwhile were lost or came before the notice, and a reader following the
log lost the lines it had not read yet at each cut)."""

from __future__ import annotations

import asyncio
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
        writer.kill()
        writer.wait()
    assert cuts >= 3, cuts
    text = path.read_text()
    assert text.startswith("[fuse: ") and "bytes of earlier console output dropped" in text.split("\n", 1)[0]
    kept = _numbers(text)
    assert kept == list(range(kept[0], LINES)), "the file lost lines or has them out of order"
    read = _numbers("".join(seen))
    assert read == list(range(LINES)), [(a, b) for a, b in zip(read, read[1:]) if b != a + 1][:5]


async def test_a_reader_whose_unread_part_was_dropped_continues_from_the_notice(make_host):
    host, vm, path = await fake_vm_with_a_small_console(make_host)
    path.write_bytes(original := b"".join(b"line-%d-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n" % i for i in range(40000)))
    size = path.stat().st_size
    host.vms._cap_console(vm)
    new_size = path.stat().st_size
    # read up to a byte past the new end that the cut dropped: what came next went with it
    dropped = int(re.match(r"\[fuse: (\d+) bytes", path.read_text()).group(1))
    assert new_size + 10 < dropped
    page = (await host.client.get("/v1/host/vms/chatty/console", params={"offset": new_size + 10})).json()
    assert page["offset"] == 0 and page["text"].startswith("[fuse: "), page["offset"]
    # a byte the cut kept: the same byte, where it is now
    page = (await host.client.get("/v1/host/vms/chatty/console", params={"offset": dropped + 40})).json()
    assert page["text"].encode()[:100] == original[dropped + 40:dropped + 140]
    # read up to the old end: the same place in the part kept, which is the new end
    page = (await host.client.get("/v1/host/vms/chatty/console", params={"offset": size})).json()
    assert page["offset"] == new_size and page["text"] == ""


def test_a_hypervisor_the_last_agent_stopped_for_a_cut_is_continued_by_the_next(tmp_path):
    from fuse.agent.vms import TRIMMING, _resume_after_cut

    p = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(p.pid, signal.SIGSTOP)
        state = lambda: open(f"/proc/{p.pid}/stat").read().rpartition(")")[2].split()[0]  # noqa: E731
        deadline = time.monotonic() + 10
        while state() not in ("T", "t"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        (marker := tmp_path / TRIMMING).write_text(str(p.pid))
        _resume_after_cut(p.pid, marker)
        deadline = time.monotonic() + 10
        while state() in ("T", "t"):
            assert time.monotonic() < deadline, "still stopped"
            time.sleep(0.01)
        assert not marker.exists()
    finally:
        p.kill()
        p.wait()


def test_a_hypervisor_stopped_by_someone_else_is_left_as_it_is(tmp_path):
    from fuse.agent.vms import TRIMMING, _resume_after_cut

    p = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(p.pid, signal.SIGSTOP)
        time.sleep(0.1)
        _resume_after_cut(p.pid, tmp_path / TRIMMING)  # no marker: not ours to continue
        time.sleep(0.1)
        assert open(f"/proc/{p.pid}/stat").read().rpartition(")")[2].split()[0] in ("T", "t")
    finally:
        p.kill()
        p.wait()
