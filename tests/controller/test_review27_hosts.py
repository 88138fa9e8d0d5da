"""Twenty-seventh session: a host registered again at another address is not the machine
the old address reached (its agent identity, its link and what it said stay there)."""

from __future__ import annotations

import fuse
import pytest
from support import free_port, start_agent, wait_until


def _reg(c, **kw):
    return c.hosts.register(fuse.RegisterHostRequest(backend="qemu", capacity=fuse.HostCapacity(
        vm_count=4, **kw.pop("cap", {})), **kw))


def test_a_host_pointed_at_an_unreachable_address_drops_the_old_agents_identity(tmp_path, procs, client):
    """(was: `old`, moved to an address where nothing answers, kept the live agent's identity:
    the reply said connected with that agent's id, cordoning `old` refused every create on
    `live` "as old: the same machine", and deregistering `live` handed its VMs to `old`)"""
    agent = start_agent(tmp_path, backend="fake")
    procs.append(agent)
    live = _reg(client, id="live", url=agent.url, token=agent.token)
    assert _reg(client, id="old", url=agent.url, token=agent.token).agent_id == live.agent_id != ""
    moved = _reg(client, id="old", url=f"http://127.0.0.1:{free_port()}", token="other",
                 cap={"cpus": 2, "ram_mb": 1000, "storage_gb": 5})
    assert moved.agent_id == "" and not moved.connected, moved
    assert not client.hosts.get("old").connected and client.hosts.get("old").agent_id == ""
    client.hosts.cordon("old")
    vm = client.vms.create({"name": "x1", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "sleep 30", "host": "live"})
    assert vm["host"] == "live"
    assert client.vms.create({"name": "x2", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "sleep 30"})["host"] == "live"
    client.hosts.uncordon("old")
    agent.stop()
    wait_until(lambda: not client.hosts.get("live").connected, timeout=30, what="live disconnected")
    client.hosts.deregister("live", force=True)
    assert [v["name"] for v in client.vms.list() if v["host"] == "old"] == []


def test_a_host_pointed_at_an_agent_that_reports_no_identity_does_not_keep_the_old_one(tmp_path, procs, client):
    """The second way in: the new address answers the probe, without an agent identity."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Facts(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"cpus": 4, "ram_mb": 1000, "storage_gb": 10, "arch": "amd64"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Facts)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        agent = start_agent(tmp_path, backend="fake")
        procs.append(agent)
        live = _reg(client, id="live", url=agent.url, token=agent.token)
        _reg(client, id="old", url=agent.url, token=agent.token)
        moved = _reg(client, id="old", url=f"http://127.0.0.1:{srv.server_address[1]}", token="t")
        assert moved.agent_id != live.agent_id, moved
        client.hosts.cordon("old")
        vm = client.vms.create({"name": "x1", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "sleep 30",
                                "host": "live"})
        assert vm["host"] == "live"
    finally:
        srv.shutdown()



@pytest.mark.timeout(240)
def test_a_copy_a_move_woke_on_a_target_removed_with_force_is_removed_when_it_comes_back(fleet):
    """(was: the move, settled failed by the force, woke the VM at its source, and the target's
    copy, already woken there, was adopted when the target came back: the VM ran twice)"""
    import httpx

    def vms_of(agent):
        r = httpx.get(agent.url + "/v1/host/vms", headers={"Authorization": f"Bearer {agent.token}"}, timeout=10)
        return {v["name"]: v for v in r.json()["vms"]}

    a, b = fleet.agent("a1"), fleet.agent("a2")
    fleet.add("a", a)
    fleet.add("b", b)
    port_b = int(b.url.rsplit(":", 1)[1])
    fleet.client.vms.create({"name": "v1", "host": "a", "shape": {"vcpus": 1, "mem_mib": 256}, "entry": "sleep 600"})
    fleet.restart(env={"FUSE_TEST_CRASH_AT": "woke"})  # the controller dies right after the target woke it
    fleet.client.moves.create("v1", to="b")
    wait_until(lambda: fleet.ctl.popen.poll() is not None, timeout=60, what="the controller's crash at woke")
    assert vms_of(b)["v1"]["state"] == "running"
    b.stop()  # (its VM lives on, as VMs outlive their agent)
    fleet.restart()
    wait_until(lambda: not fleet.client.hosts.get("b").connected, timeout=30, what="b disconnected")

    def forced():  # (the crashed controller's lease on the move runs out first: 409 till then)
        try:
            fleet.client.hosts.deregister("b", force=True)
            return True
        except fuse.ApiError as e:
            assert e.code == "move_in_progress", e
            return False
    wait_until(forced, timeout=30, interval=0.5, what="b removed with force")
    wait_until(lambda: vms_of(a).get("v1", {}).get("state") == "running", timeout=30, what="v1 woken at a")
    back = fleet.agent("a2", port=port_b)  # the same agent, its state dir, comes back
    fleet.add("b", back)
    wait_until(lambda: "v1" not in vms_of(back) or vms_of(back)["v1"]["state"] == "deleted", timeout=30,
               what="the second copy removed")
    wait_until(lambda: [(v["name"], v["host"], v["state"]) for v in fleet.client.vms.list()]
               == [("v1", "a", "running")], timeout=30, what="the fleet's list")
    lost = [e for e in fleet.client.events.list(0, limit=500)["events"] if e["type"] == "vm_lost" and e.get("move")]
    assert lost and lost[-1]["host"] == "b" and "runs in one place" in lost[-1]["reason"], lost
