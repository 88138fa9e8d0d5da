"""Twenty-sixth session: a VM's console log is bounded (one guest printing without pause filled
the host's disk, and every other VM's sleep and create failed with it)."""

from __future__ import annotations

import asyncio
import os
import re
import time

import pytest
from agent_support import fake_vm_with_a_small_console

SHAPE = {"vcpus": 1, "mem_mib": 128}


async def test_a_console_past_its_cap_is_cut_back_to_its_last_lines(make_host):
    host, vm, path = await fake_vm_with_a_small_console(make_host)
    with open(path, "ab") as f:
        for i in range(40000):
            f.write(f"line {i:06d} of the guest's output\n".encode())
    size = path.stat().st_size
    assert size > 1 << 20
    host.vms._cap_console(vm)
    text = path.read_bytes()
    assert len(text) <= (1 << 19) + 200
    assert text.startswith(b"[fuse: ") and b"bytes of earlier console output dropped" in text
    # (the fake VM's own first lines may come after the test's, on a loaded machine)
    assert b"line 039999 of the guest's output\n" in text
    assert text.split(b"\r\n", 1)[1].startswith(b"line ")  # (cut at a line)
    trimmed = [e for e in host.vms.events.list() if e["type"] == "console_trimmed"]
    assert [(e["vm"], e["dropped_bytes"] > 0) for e in trimmed] == [("chatty", True)]
    # offsets count every byte printed (review 28): a reader at the old end continues there
    page = (await host.client.get("/v1/host/vms/chatty/console", params={"offset": size})).json()
    # (nothing printed before it again; the fake VM's own first lines may come only now, loaded)
    assert page["offset"] == size and "of the guest's output" not in page["text"], page


@pytest.mark.qemu
@pytest.mark.timeout(240)
async def test_a_real_guest_printing_without_pause_keeps_its_log_bounded_and_its_exit_line(make_host, monkeypatch):
    monkeypatch.setenv("FUSE_CONSOLE_MAX_MB", "1")
    host = await make_host()
    # numbered lines (review 28: a cut while QEMU printed lost lines, or put some before its notice)
    entry = ("i=0; while [ $i -lt 150000 ]; do echo line-$i-abcdefghijklmnopqrstuvwxyz; i=$((i+1)); done; "
             "echo all-printed; exit 7")
    r = await host.client.post("/v1/host/vms", json={"name": "chatty", "shape": SHAPE, "entry": entry})
    assert r.status_code == 201, r.text
    path = host.vms.vm_dir("chatty") / "console.log"
    biggest, deadline = 0, time.monotonic() + 200
    while (await host.client.get("/v1/host/vms/chatty")).json()["state"] == "running":
        assert time.monotonic() < deadline, "the guest did not finish"
        biggest = max(biggest, path.stat().st_size if path.exists() else 0)
        await asyncio.sleep(0.2)
    vm = (await host.client.get("/v1/host/vms/chatty")).json()
    assert (vm["state"], vm["exit_status"]) == ("exited", 7), vm
    # 2 s between checks at most: the guest's output in that time on top of the 1 MiB cap
    assert biggest < 8 << 20 and os.path.getsize(path) < 8 << 20, biggest
    text = path.read_text(errors="replace")
    assert "earlier console output dropped" in text and "all-printed" in text
    assert text.startswith("[fuse: "), text[:200]  # the notice is the first line
    kept = [int(n) for n in re.findall(r"line-(\d+)-abcdefghijklmnopqrstuvwxyz\r?\n", text)]
    assert kept and kept == list(range(kept[0], 150000)), "lines lost in the cut"
    assert [e for e in host.vms.events.list() if e["type"] == "console_trimmed"]


@pytest.mark.parametrize("value", ["abc", "0", "1.5", "-3"])
def test_the_agent_refuses_a_console_cap_that_is_no_whole_number_of_mib(tmp_path, value):
    import subprocess

    from support import FUSE, free_port
    r = subprocess.run(FUSE + ["host", "serve", "--listen", f"127.0.0.1:{free_port()}", "--state-dir",
                               str(tmp_path / "s"), "--socket", str(tmp_path / "a.sock"), "--backend", "fake"],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "FUSE_CONSOLE_MAX_MB": value})
    assert r.returncode == 2 and "FUSE_CONSOLE_MAX_MB" in r.stderr and "Traceback" not in r.stderr, r.stderr
