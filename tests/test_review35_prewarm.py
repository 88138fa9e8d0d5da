"""Review 35, prewarms against a real controller and real host agents (fake backend):

- a prewarm made while a fill pass was creating another prewarm's standby VM counted that VM's
  room twice (taken as being placed, and again as still to be created): on auto it bought a
  machine it did not need, pinned to the host it was refused 409 on a host with room for it;
- a prewarm pinned to a full host tried its standby create again at every pass (about once a
  second), logging a warning and using a VM name each time: it waits for room, trying again
  less and less often (at least every 30 s), and says so once."""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time

import pytest

import fuse
from support import free_port, start_agent, start_controller, wait_until

# the waits of a refill that found no room on a pinned host (prewarm.py's ROOM_RETRY_FIRST_S,
# doubling, at most ROOM_RETRY_MAX_S)
FIRST_WAIT_S, LONGEST_WAIT_S = 2.0, 30.0


class SlowCreates:
    """A TCP proxy to a host agent that holds each VM create (``POST /v1/host/vms``) for ``delay``
    seconds while ``hold`` is set: the create is placed (its room reserved) and waits on the
    host's answer, not in the store yet. Everything else passes at once."""

    def __init__(self, target: int, delay: float):
        self.port, self.target, self.delay = free_port(), target, delay
        self.hold, self.seen = threading.Event(), threading.Event()
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.target))
            self.socks += [down, up]
            threading.Thread(target=self._pump, args=(down, up, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, to_agent: bool) -> None:
        try:
            while data := src.recv(65536):
                if to_agent and data.startswith(b"POST /v1/host/vms ") and self.hold.is_set():
                    self.seen.set()
                    time.sleep(self.delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()
        for s in self.socks:
            s.close()


def register(client, host_id: str, url: str, token: str, mem: int, slots: int) -> None:
    client.hosts.register(fuse.RegisterHostRequest(id=host_id, url=url, token=token, backend="qemu",
                                                   capacity=fuse.HostCapacity(vm_count=slots, ram_mb=mem, cpus=8)))
    wait_until(lambda: client.hosts.get(host_id).connected, timeout=30, what=f"host {host_id} connected")


def prewarm(client, pw_id: str) -> fuse.Prewarm:
    return next(p for p in client.pool.prewarms() if p.id == pw_id)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("on", ["auto", "host:own"])
def test_a_prewarm_made_while_anothers_vm_is_being_created_counts_that_room_once(tmp_path, procs, on):
    procs.append(agent := start_agent(tmp_path, backend="fake", port=free_port()))
    proxy = SlowCreates(int(agent.url.rsplit(":", 1)[1]), delay=4)
    procs.append(ctl := start_controller(tmp_path))
    try:
        with fuse.Client(ctl.url) as client:
            # a cloud to buy from: a second prewarm that miscounts the own host's room buys a machine
            client.pool.link_cloud("dev", "local", {"backend": "fake"})
            register(client, "own", proxy.url, agent.token, mem=2048, slots=8)  # room for 8 of 256 MiB
            opts = fuse.PrewarmOptions(count=4, cpus=1, memory_mb=256, on=on, ttl_secs=600)
            proxy.hold.set()
            a = client.pool.prewarm("linux", opts)
            assert [(p.host, p.count) for p in a.placements] == [("own", 4)] and a.new_hosts == [], a
            assert proxy.seen.wait(30), "no standby create of A's came"  # (one of A's VMs in flight now)
            b = client.pool.prewarm("linux", opts)  # (was: 409 on host:own, or one VM on a machine bought)
            assert [(p.host, p.count) for p in b.placements] == [("own", 4)], b.placements
            assert b.new_hosts == [] and client.pool.cloud_hosts() == [], (b, client.pool.cloud_hosts())
            proxy.hold.clear()
            # the room was there: both fill on the one host
            for pw in (a, b):
                wait_until(lambda pw=pw: prewarm(client, pw.id).ready == 4, timeout=60, interval=0.3,
                           what=f"{pw.id} ready")
            assert client.pool.cloud_hosts() == [], (client.pool.cloud_hosts(), client.pool.prewarms())
            for pw in client.pool.prewarms():
                client.pool.remove_prewarm(pw.id)
            if bought := [h.name for h in client.pool.cloud_hosts()]:
                client.pool.cloud_remove_host(bought)
    finally:
        proxy.hold.clear()
        proxy.close()


def next_number(ctl, pw_id: str) -> int:
    """The number the prewarm's next standby VM's name takes (each create tried uses one)."""
    with sqlite3.connect(ctl.state_dir / "fuse.db", timeout=30) as db:
        (rec,) = db.execute("SELECT record FROM prewarms WHERE id = ?", (pw_id,)).fetchone()
    return json.loads(rec)["next"]


@pytest.mark.timeout(180)
def test_a_prewarm_pinned_to_a_full_host_waits_for_room_backing_off_and_says_so_once(tmp_path, procs):
    procs.append(agent := start_agent(tmp_path, backend="fake", port=free_port()))
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as client:
        register(client, "own", agent.url, agent.token, mem=1024, slots=4)  # room for 4 of 256 MiB
        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=4, cpus=1, memory_mb=256, on="host:own"))
        wait_until(lambda: prewarm(client, pw.id).ready == 4, timeout=60, interval=0.3, what="4 ready")
        # a create of the shape claims one: the host is full, the prewarm one short
        job = client.vms.create(name="job", shape={"vcpus": 1, "mem_mib": 256}, entry="sleep 600")
        assert job["host"] == "own"

        def said() -> list[str]:
            return [line for line in ctl.logs().splitlines() if pw.id in line
                    and ("no room" in line or "no host can take" in line)]
        wait_until(lambda: said(), timeout=30, interval=0.3, what="the refill finding no room")
        start, t0 = next_number(ctl, pw.id), time.monotonic()
        time.sleep(16)
        tried = next_number(ctl, pw.id) - start
        # (every pass, about once a second, tried a create: 15 or so; backing off from
        # FIRST_WAIT_S, doubling: 3 or 4)
        waits, t = [], FIRST_WAIT_S
        while sum(waits) < time.monotonic() - t0:
            waits.append(t)
            t = min(t * 2, LONGEST_WAIT_S)
        assert tried <= len(waits) + 1, f"{tried} standby creates tried in 16 s"
        lines = said()
        assert len(lines) == 1, lines  # (said once for the wait, not at every try)
        assert "host own has no room for its standby VMs" in lines[0] and "wait for room" in lines[0], lines[0]
        assert prewarm(client, pw.id).ready == 3

        # room again: the refill takes it within its longest wait
        client.vms.delete("job")
        wait_until(lambda: prewarm(client, pw.id).ready == 4, timeout=LONGEST_WAIT_S + 30, interval=0.5,
                   what="the prewarm refilled once the host had room")
        assert len(said()) == 1
        client.pool.remove_prewarm(pw.id)
