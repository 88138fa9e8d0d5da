"""Review 16 of `fuse controller vms` and `fuse up`: `vms console` prints the whole log,
not its first 64 KiB page; `--follow` ends once the VM's run is over (or the VM is
deleted); the `vms` and `vms get` tables say how a finished VM ended; and `fuse up`
deletes, through its agent, the VMs an earlier run left whatever their names, and its
own at the end, so no record stays "running" over a QEMU killed under its agent.

The CLI tests run a real controller and fake-backend agents (`test_fuse_commands`);
the `fuse up` ones real QEMU (`test_up_single`)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

import fuse
from support import FUSE, end_fake_vm, wait_until
from test_fuse_commands import env, fuse_cli  # noqa: F401  (env: a controller and two fake agents)
from test_up_single import Up, left, pytestmark as needs_qemu, state  # noqa: F401  (state: a fuse up dir)

FAILED_REASON = "the hypervisor process ended without the guest reporting an exit status"  # (the agent's)


def _vm(env, name: str, entry: str = "job") -> Path:
    """Register the first agent as host h1 and create VM ``name`` there; its console.log."""
    a1 = env["agents"][0]
    fuse_cli(env, "controller", "hosts", "add", "--name", "h1", "--addr", a1.url, "--agent-token", a1.token)
    fuse_cli(env, "controller", "vms", "create", "--name", name, "--entry", entry, "--host", "h1")
    return Path(a1.state_dir) / "vms" / name / "console.log"


def _end(env, name: str, exit_status: int | None) -> None:
    """End the fake VM (exited with ``exit_status``, or failed for None) and wait till the controller says so."""
    end_fake_vm(env["agents"][0], name, exit_status)
    want = "exited" if exit_status is not None else "failed"
    with fuse.Client(env["ctl"].url) as c:
        wait_until(lambda: c.vms.get(name)["state"] == want and {v["name"]: v["state"] for v in c.vms.list()}
                   .get(name) == want, what=f"vm {name} {want}")


def _rows(out: str) -> list[dict[str, str]]:
    """The rows of a rich table the CLI printed, by column header; a cell wrapped over
    several lines is joined back with spaces."""
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("┃"))
    cols = [c.strip() for c in lines[header].strip("┃").split("┃")]
    rows: list[dict[str, str]] = []
    for line in lines[header + 1:]:
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip("│").split("│")]
        if cells[0] or not rows:
            rows.append(dict(zip(cols, cells)))
        else:  # the wrapped rest of the row above
            for col, cell in zip(cols, cells):
                if cell:
                    rows[-1][col] = f"{rows[-1][col]} {cell}".strip()
    return rows


def test_console_without_follow_prints_the_whole_log_not_its_first_page(env):
    # it had printed the first 64 KiB and exited 0, saying nothing of the rest
    log = _vm(env, "big1")
    with open(log, "a") as f:
        f.writelines(f"line-{i}-{'x' * 60}\n" for i in range(4000))  # ~280 KiB: five pages
        f.write("LAST-LINE\n")
    _end(env, "big1", 0)
    whole = log.read_text()
    assert len(whole.encode()) > 4 * 65536
    assert fuse_cli(env, "controller", "vms", "console", "big1").stdout == whole
    out = json.loads(fuse_cli(env, "controller", "vms", "console", "big1", "--json").stdout)
    assert out == {"text": whole, "offset": 0, "next_offset": len(whole.encode())}
    # and from an offset on, to the end too
    rest = json.loads(fuse_cli(env, "controller", "vms", "console", "big1", "--json", "--offset", "100").stdout)
    assert rest["text"] == whole[100:] and rest["next_offset"] == len(whole.encode())


@pytest.mark.parametrize("how", ["exited before", "exits", "fails", "is deleted"], ids=[
    "a vm that had exited: the follow prints its console and ends",
    "a vm that exits while followed: the follow ends once all it wrote is printed",
    "a vm that fails while followed: the follow ends once all it wrote is printed",
    "a vm deleted while followed: the follow ends saying so"])
def test_console_follow_ends_once_the_vms_run_is_over(env, how):
    # it had polled on for ever, the VM long gone
    log = _vm(env, "f2")
    if how == "exited before":
        _end(env, "f2", 0)
    follow = subprocess.Popen(FUSE + ["controller", "vms", "console", "f2", "--follow"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env["env"])
    try:
        if how != "exited before":
            wait_until(lambda: log.exists() and log.read_text().count("\n") >= 3, what="the fake vm writing")
            time.sleep(1)  # (the follow is polling by now)
            if how == "is deleted":
                fuse_cli(env, "controller", "vms", "delete", "f2")
            else:
                _end(env, "f2", 3 if how == "exits" else None)
        out, err = follow.communicate(timeout=30)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.communicate()
    assert follow.returncode == 0, err
    if how == "is deleted":
        assert "vm f2 was deleted: its console ends here" in err
        assert out.startswith("fake vm: entry job\n0\n")
    else:
        assert out == log.read_text() and ("FUSE-EXIT 3 " in out) == (how == "exits"), (out[-300:], err)


@pytest.mark.parametrize("exit_status", [7, None], ids=["an exited vm shows its exit status",
                                                        "a failed vm shows why it failed"])
def test_vms_get_and_list_show_how_a_finished_vm_ended(env, exit_status):
    # the tables had no exit status or reason: only --json told how the run ended
    _vm(env, "done1")
    running = _rows(fuse_cli(env, "controller", "vms", "get", "done1").stdout)
    assert (running[0]["state"], running[0]["exit status"], running[0]["reason"]) == ("running", "", "")
    _end(env, "done1", exit_status)
    want = {"name": "done1", "state": "exited", "exit status": "7", "reason": ""} if exit_status is not None else \
        {"name": "done1", "state": "failed", "exit status": "", "reason": FAILED_REASON}
    for args in (["vms", "get", "done1"], ["vms"]):
        (row,) = _rows(fuse_cli(env, "controller", *args).stdout)
        assert {k: row[k] for k in want} == want, (args, row)


# ---- fuse up (real QEMU) ----------------------------------------------------------

def _agent_records(state: Path) -> dict[str, str]:
    """The VM records the run's agent keeps on disk: name -> state."""
    vms = state / "agent" / "vms"
    return {p.parent.name: json.loads(p.read_text())["state"] for p in vms.glob("*/vm.json")} if vms.exists() else {}


@needs_qemu
def test_up_removes_the_vm_an_earlier_killed_run_left_whatever_its_name(state):
    # the next run (another --vm-name) had adopted it, kept it running all along, then
    # SIGKILLed its QEMU at exit under its agent: its record said running, failed next start
    first = Up(state.parent, "--vm-name", "old")
    first.wait_for("serving; Ctrl-C")
    first.proc.kill()  # no clean-up: its agent and controller stop with it, its VM stays
    first.wait()
    wait_until(lambda: not [c for c in left(state) if "fuse.cli" in c], timeout=30, what="the first run's servers gone")
    assert _agent_records(state) == {"old": "running"}
    second = Up(state.parent, "--vm-name", "new")
    try:
        second.wait_for("serving; Ctrl-C")
        with fuse.Client(f"unix://{state}/run/controller.sock") as c:
            assert [v["name"] for v in c.vms.list()] == ["new"]
        assert _agent_records(state) == {"new": "running"}
        assert not [c for c in left(state) if "/vms/old/" in c], left(state)  # its QEMU stopped
        assert "removed vm old (running) left by an earlier run" in second.output()
    finally:
        second.proc.send_signal(signal.SIGTERM)
        second.wait()
    assert _agent_records(state) == {}
    wait_until(lambda: not left(state), timeout=30, what=f"nothing of either run left: {left(state)}")


@needs_qemu
def test_up_deletes_every_vm_of_its_agent_at_the_end_not_only_its_own(state):
    # a VM made through its controller while it served had its QEMU SIGKILLed under the
    # agent: its record stayed "running" in agent/vms until the next start failed it
    up = Up(state.parent)
    try:
        up.wait_for("serving; Ctrl-C")
        with fuse.Client(f"unix://{state}/run/controller.sock") as c:
            c.vms.create({"name": "extra", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "sleep 3600"})
        assert _agent_records(state) == {"hello": "running", "extra": "running"}
    finally:
        up.proc.send_signal(signal.SIGTERM)
        assert up.wait() == 0, up.output()[-3000:]
    assert _agent_records(state) == {}, up.output()[-2000:]
    assert "killed" not in up.output()  # (deleted through the agent: no QEMU was left to kill)
    wait_until(lambda: not left(state), timeout=30, what=f"nothing of the run left: {left(state)}")
