"""`fuse up` owns its dir and what it started, from its first moment: a second run
in the same dir refuses at once and leaves the first's VM alone; SIGTERM at any
point cleans up as Ctrl-C does (agent, controller, QEMU); a VM left by a run that
never cleaned up does not stop the next run. Real processes and a real VM."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from support import FUSE, BUNDLE_HOME, reap, real_bundle_dir, wait_until

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/qemu-system-x86_64"), reason="needs QEMU")


class Up:
    """A `fuse up` run in ``tmp`` (state in ``tmp/fuse-state``), its output in ``up-N.log``."""

    runs = 0

    def __init__(self, tmp: Path, *args: str):
        Up.runs += 1
        self.log = tmp / f"up-{Up.runs}.log"
        self.proc = subprocess.Popen(FUSE + ["up", "--state-dir", str(tmp / "fuse-state"), *args], cwd=tmp,
                                     stdout=open(self.log, "wb"), stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 240) -> None:
        wait_until(lambda: text in self.output() or self.proc.poll() is not None, timeout=timeout, interval=0.2,
                   what=text)
        assert text in self.output(), self.output()[-3000:]

    def wait(self, timeout: float = 90) -> int:
        return self.proc.wait(timeout)


@pytest.fixture
def state(tmp_path):
    """``tmp_path/fuse-state`` with the guest bundle and its kernel package in place (hard
    links), so `fuse up` finds its bundle up to date; every process left mentioning it is
    killed afterwards."""
    bundle = real_bundle_dir()
    agent = tmp_path / "fuse-state" / "agent"
    for src, dest in [(BUNDLE_HOME / "cache", agent / "cache"), (bundle, agent / "bundles" / "linux")]:
        dest.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            os.link(f, dest / f.name)
    yield tmp_path / "fuse-state"
    reap(tmp_path / "fuse-state")


def left(state: Path) -> list[str]:
    """Command lines of the processes still mentioning the state dir."""
    from fuse.agent.backends.base import pids_mentioning
    out = []
    for pid in pids_mentioning(state):
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
        except OSError:
            pass
    return out


def vm_state(state: Path, name: str = "hello") -> str:
    import fuse
    with fuse.Client(f"unix://{state}/run/controller.sock") as c:
        return c.vms.get(name)["state"]


def test_a_second_run_in_the_same_dir_refuses_at_once_and_leaves_the_first_alone(state):
    first = Up(state.parent)
    try:
        first.wait_for("serving; Ctrl-C")
        assert vm_state(state) == "running"
        second = Up(state.parent)
        rc = second.wait(30)
        assert rc != 0 and f"fuse up is already running in {state}" in second.output(), second.output()
        assert vm_state(state) == "running" and first.proc.poll() is None
    finally:
        first.proc.send_signal(signal.SIGTERM)
        first.wait()
    wait_until(lambda: not left(state), timeout=30, what="nothing of the run left")


@pytest.mark.parametrize("at", ["vm hello placed on", "controller on unix://"],
                         ids=["once the vm is placed", "before the host is registered"])
def test_sigterm_before_serving_stops_what_the_run_started(state, at):
    up = Up(state.parent)
    up.wait_for(at)
    up.proc.send_signal(signal.SIGTERM)
    up.wait()
    wait_until(lambda: not left(state), timeout=30, what=f"nothing of the run left: {left(state)}")


def test_a_vm_left_by_a_run_that_never_cleaned_up_does_not_stop_the_next(state):
    first = Up(state.parent)
    first.wait_for("vm hello placed on")
    first.proc.kill()  # no clean-up at all: its agent, controller and VM live on...
    first.wait()
    time.sleep(1)
    reap(state)  # ...until they are killed too, leaving the agent's record of hello
    wait_until(lambda: not left(state), timeout=30, what="the first run's processes gone")
    second = Up(state.parent, "--once")
    assert second.wait(240) == 0, second.output()[-3000:]
    assert "vm hello placed on local" in second.output()


def test_a_run_killed_outright_takes_its_agent_and_controller_with_it(state):
    first = Up(state.parent)
    first.wait_for("vm hello placed on")
    first.proc.kill()  # no clean-up of its own: its agent and controller stop with it (the VM stays)
    first.wait()
    wait_until(lambda: not [c for c in left(state) if "fuse.cli" in c], timeout=30,
               what=f"the first run's agent and controller gone: {left(state)}")
    second = Up(state.parent, "--once")  # not refused for a busy socket
    assert second.wait(240) == 0, second.output()[-3000:]
    assert "vm hello placed on local" in second.output()
    wait_until(lambda: not left(state), timeout=30, what=f"nothing of either run left: {left(state)}")
