"""A controller or agent stopped (SIGTERM) with a request in flight on its unix socket while it
also listens on TCP answers that request before it closes its store, clients and event log:
review 36 found the app's shutdown run by the TCP listener alone, once its own connections were
done: a create in flight on the controller's socket was a false ``502 host_unreachable`` ("pop
from an empty deque": its HTTP clients closed under it) though the host made the VM, and an
agent's was a 500 (its event log closed: the VM's event lost)."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

import fuse
from support import Proxy, start_agent, start_controller, wait_until

pytestmark = pytest.mark.timeout(180)


def test_a_create_in_flight_on_the_controllers_socket_at_sigterm_is_answered(tmp_path):
    agent = start_agent(tmp_path, backend="fake", name="a1")
    proxy = Proxy(int(agent.url.rsplit(":", 1)[1]))
    ctl = start_controller(tmp_path, listen=True, token="ct")
    try:
        with fuse.Client(ctl.url) as c:  # (the unix socket)
            c.hosts.register(fuse.RegisterHostRequest(id="h1", url=proxy.url, token=agent.token,
                                                      capacity=fuse.HostCapacity(vm_count=4)))
            proxy.hold[b"POST /v1/host/vms "] = 2.0
            out: dict[str, object] = {}

            def create() -> None:
                try:
                    out["vm"] = c.vms.create({"name": "v1", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "x"})
                except fuse.ApiError as err:
                    out["error"] = err

            t = threading.Thread(target=create, daemon=True)
            t.start()
            wait_until(lambda: proxy.held >= 1, timeout=30, what="the create held at the agent's proxy")
            ctl.popen.send_signal(signal.SIGTERM)
            t.join(60)
            assert "error" not in out, out["error"]
            assert out["vm"]["name"] == "v1" and out["vm"]["host"] == "h1", out
        assert ctl.popen.wait(30) == 0, ctl.logs()[-2000:]
        assert "Traceback" not in ctl.logs(), ctl.logs()[-3000:]
        with httpx.Client(base_url=agent.url, headers={"Authorization": f"Bearer {agent.token}"}) as a:
            assert [v["name"] for v in a.get("/v1/host/vms").json()["vms"]] == ["v1"]
        ctl = start_controller(tmp_path, listen=True, token="ct")  # (what it recorded before it stopped)
        with fuse.Client(ctl.url) as c:
            assert [(v["name"], v["host"]) for v in c.vms.list()] == [("v1", "h1")]
            placed = [e for e in c.events.list(0, limit=500)["events"] if e["type"] == "placed"]
            assert len(placed) == 1 and not placed[0].get("unanswered"), placed
    finally:
        proxy.close()
        ctl.stop()
        agent.stop()


def test_a_long_poll_on_the_agents_socket_still_ends_at_once_on_sigterm(tmp_path):
    """(the stop still ends the requests that wait on purpose: the shutdown waits for the rest)"""
    agent = start_agent(tmp_path, backend="fake", name="a1")
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(agent.socket)), base_url="http://agent",
                          timeout=60) as a:
            out: dict[str, object] = {}
            t = threading.Thread(target=lambda: out.setdefault(
                "r", a.get("/v1/host/events", params={"since": 10 ** 9, "wait_s": 30})), daemon=True)
            t.start()
            time.sleep(1.0)
            start = time.monotonic()
            agent.popen.send_signal(signal.SIGTERM)
            assert agent.popen.wait(20) == 0, agent.logs()[-2000:]
            assert time.monotonic() - start < 10
            t.join(10)
            assert "Traceback" not in agent.logs(), agent.logs()[-3000:]
    finally:
        agent.stop()


def test_an_agent_whose_startup_fails_exits_3(tmp_path):
    """(the diff review: with the app's lifespan run by `serve` itself, a failed startup returned
    and the process exited 0, so a supervisor's Restart=on-failure did not restart it; uvicorn's 3)"""
    import subprocess

    from support import FUSE, fake_bundle, free_port

    state = tmp_path / "a1"
    state.mkdir()
    fake_bundle(state)
    (state / "events.jsonl").mkdir()  # (its event log cannot be opened: the app's startup fails)
    p = subprocess.run([*FUSE, "host", "serve", "--listen", f"127.0.0.1:{free_port()}", "--state-dir", str(state),
                        "--backend", "fake", "--socket", str(tmp_path / "a1.sock"), "--token", "t"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 3, (p.returncode, p.stderr[-2000:])
    assert not (tmp_path / "a1.sock").exists()


def test_an_agent_whose_port_is_taken_exits_3_in_one_line(tmp_path):
    """(the diff review: uvicorn's own exit for the port, raised from its server's task, ended the
    loop under the app's lifespan: a traceback of its cancellation followed the one-line error)"""
    import socket
    import subprocess

    from support import FUSE, fake_bundle

    state = tmp_path / "a1"
    state.mkdir()
    fake_bundle(state)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        p = subprocess.run([*FUSE, "host", "serve", "--listen", f"127.0.0.1:{taken.getsockname()[1]}",
                            "--state-dir", str(state), "--backend", "fake", "--socket", str(tmp_path / "a1.sock"),
                            "--token", "t"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 3, (p.returncode, p.stderr[-2000:])
    assert "address already in use" in p.stderr and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert not (tmp_path / "a1.sock").exists()
