"""Review 37: an agent at its file descriptor limit answered ``GET /v1/host`` with 500 (it could
not open /proc/meminfo) and listed no bundles (their manifests could not be opened, read as
"not usable"): the controller's poller took the 500 for a host gone and failed the creates in
flight there (which landed all the same), and its placement refused creates 400 "has no
bundle". A read the agent cannot make now tells nothing: it answers with its last figures
and bundles, saying so in its log once."""

from __future__ import annotations

import os
import resource
import socket
import time

import httpx

from support import start_agent, wait_until


def _fds(pid: int) -> list[int]:
    return [int(n) for n in os.listdir(f"/proc/{pid}/fd")]


def _at_its_fd_limit(agent, port: int) -> tuple[list[socket.socket], tuple[int, int]]:
    """Lower the agent's descriptor limit to just past what it has open, then take the rest with
    idle connections: (those connections, the limits it had)."""
    pid = agent.popen.pid
    before = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    limit = max(_fds(pid)) + 4
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, before[1]))
    held: list[socket.socket] = []
    # (each one the agent accepts takes a descriptor; past the limit they wait in its backlog)
    for _ in range(limit + 4 - len(_fds(pid))):
        held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    wait_until(lambda: len(_fds(pid)) >= limit, timeout=20, what="the agent at its descriptor limit")
    return held, before


def test_an_agent_at_its_fd_limit_answers_its_summary_with_its_last_figures_and_bundles(tmp_path, procs):
    agent = start_agent(tmp_path, backend="fake")
    procs.append(agent)
    port = int(agent.url.rsplit(":", 1)[1])
    # (one connection, open before the limit bites: the agent has no descriptor for another)
    c = httpx.Client(base_url=agent.url, headers={"Authorization": f"Bearer {agent.token}"}, timeout=15)
    r = c.get("/v1/host")
    assert r.status_code == 200 and [b["name"] for b in r.json()["bundles"]] == ["linux"], r.text
    known = r.json()
    held, before = _at_its_fd_limit(agent, port)
    try:
        for _ in range(2):
            r = c.get("/v1/host")
            # (was: 500 "Too many open files: '/proc/meminfo'"; then bundles [], "not usable")
            assert r.status_code == 200, r.text
            got = r.json()
            assert got["bundles"] == known["bundles"], got
            assert got["cpus"] == known["cpus"] and got["ram_mb"] == known["ram_mb"], got
            assert isinstance(got["free_mem_mib"], int) and got["free_mem_mib"] > 0, got
        # a create's own check of its bundle cannot open the manifest either: not "no bundle"
        r = c.post("/v1/host/vms", json={"name": "v", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "x"})
        # (was: 400 invalid_argument "bundle linux is not usable: its manifest.json cannot be read"; now
        # the bundle's last check stands, and what fails is the record the agent cannot write now)
        assert r.json()["error"]["code"] != "invalid_argument" and "bundle" not in r.text, r.text
        # a registration's fresh probe cannot read the machine either: the facts it has stand
        r = c.get("/v1/host", params={"fresh": "true"})
        assert r.status_code == 200, r.text
        assert r.json()["cpus"] == known["cpus"] and "could not read the machine now" in r.json()["probe_note"]
    finally:
        for s in held:
            s.close()
        resource.prlimit(agent.popen.pid, resource.RLIMIT_NOFILE, before)
    logs = agent.logs()
    assert logs.count("cannot be listed now (Too many open files): its last listing stands") == 1, logs[-3000:]
    assert logs.count("cannot be checked now (Too many open files): its last check stands") == 1, logs[-3000:]
    assert logs.count("/proc/meminfo cannot be read now") == 1, logs[-3000:]
    assert "unhandled error" not in logs, logs[-3000:]
    # descriptors back: checked and listed as ever, and the next shortage is logged again
    deadline = time.monotonic() + 20
    while (r := c.get("/v1/host")).status_code != 200 or r.json()["bundles"] != known["bundles"]:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.1)
    assert "probe_note" not in c.get("/v1/host", params={"fresh": "true"}).json()
    c.close()
    agent.stop()
