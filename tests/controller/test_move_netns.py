"""The network to the target is cut mid-copy: the target agent runs in a
network namespace this test creates, reached over a veth pair whose link
the test takes down. The VM must come home, and once the link is back the
target's half-copied incoming side is cleaned up."""

from __future__ import annotations

import subprocess

import pytest

import fuse
from support import FUSE, Proc, fake_bundle, free_port, ip, reap, start_agent, start_controller, veth_netns, wait_until


@pytest.fixture
def netns():
    yield from veth_netns("t")


def test_cutting_the_network_to_the_target_mid_copy_brings_the_vm_home(tmp_path, netns):
    src = start_agent(tmp_path, backend="fake", name="agent-src")
    state = tmp_path / "agent-dst"
    state.mkdir()
    fake_bundle(state)
    port = free_port()
    log = tmp_path / "agent-dst.log"
    dst = Proc(subprocess.Popen(["ip", "netns", "exec", netns["name"], *FUSE, "host", "serve", "--listen",
                                 f"{netns['addr']}:{port}", "--state-dir", str(state), "--backend", "fake",
                                 "--token", "t", "--socket", str(tmp_path / "dst.sock")],
                                stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True),
               log, url=f"http://{netns['addr']}:{port}", token="t", state_dir=state)
    ctl = start_controller(tmp_path, env={"FUSE_MOVE_IO_TIMEOUT": "3",
                                                # chunks keep flowing for a few seconds: the cut comes mid-copy
                                                "FUSE_TEST_CHUNK_DELAY": "0.1"})
    try:
        import httpx
        wait_until(lambda: httpx.get(dst.url + "/v1/host", headers={"Authorization": "Bearer t"}, timeout=2)
                   .status_code == 200, what="agent in the namespace")
        with fuse.Client(ctl.url) as c:
            for host_id, a in (("src", src), ("dst", dst)):
                c.hosts.register(fuse.RegisterHostRequest(id=host_id, url=a.url, token=a.token, backend="qemu",
                                                          capacity=fuse.HostCapacity(vm_count=4)))
            c.vms.create({"name": "job1", "shape": {"vcpus": 1, "mem_mib": 8192}, "entry": "count", "host": "src"})
            m = c.moves.create("job1", to="dst")  # a 128 MiB image: 32 chunks
            wait_until(lambda: c.moves.get(m["id"])["copied_bytes"] > 0, timeout=30, what="copy started")
            ip("link", "set", netns["host_if"], "down")
            m = wait_until(lambda: (x := c.moves.get(m["id"]))["state"] in ("done", "failed") and x, timeout=60,
                           what="move to fail")
            assert m["state"] == "failed" and m["copied_bytes"] < m["total_bytes"]
            vm = c.vms.get("job1", host="src")
            assert vm["state"] == "running"
            ip("link", "set", netns["host_if"], "up")

            def target_clean():
                r = httpx.get(dst.url + "/v1/host/incoming", headers={"Authorization": "Bearer t"}, timeout=2)
                return r.json()["incoming"] == [] and "job1" not in {v["name"] for v in httpx.get(
                    dst.url + "/v1/host/vms", headers={"Authorization": "Bearer t"}, timeout=2).json()["vms"]}
            wait_until(target_clean, timeout=60, what="target's incoming side cleaned after the link is back")
    finally:
        ctl.stop()
        src.stop()
        dst.stop()
        reap(tmp_path)
