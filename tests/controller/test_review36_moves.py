"""Review 36 (rL-2, rL-3, rM-3, rM-4): a move's driver and what it says.

- A PostgreSQL stall of ~8 s mid-copy killed the driver's task ("Task exception was never
  retrieved", the OperationalError raised again by the failure path); its own janitor then
  "took the move over" from itself (and a second replica from it) and failed it as a dead
  controller's. The driver waits for the database, the move goes through, no replica takes it.
- A replica whose move another one took over (it stalled past its lease) left its copy thread
  reading the source, and that thread's error was logged as a task's never read.
- A move failed by an answer that is not the agent's had a bare Python exception as its reason
  ("JSONDecodeError: Expecting value ...", "AttributeError: 'list' object has no attribute
  'get'", "KeyError: 'files'"): the reason names the host and what was wrong.
- A copy over a slow link, bytes moving all along, failed "stalled: nothing moved for 10 s".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time

import pytest

import fuse
from support import reap, start_agent, start_controller, wait_until


def _vm(name: str, mem: int = 1024, **kw) -> dict:
    return {"name": name, "shape": {"vcpus": 1, "mem_mib": mem}, "entry": "count", **kw}


def _register(client: fuse.Client, host_id: str, url: str, token: str) -> None:
    client.hosts.register(fuse.RegisterHostRequest(id=host_id, url=url, token=token, backend="qemu",
                                                   capacity=fuse.HostCapacity(vm_count=4, ram_mb=8192, cpus=4)))


def _ended(client: fuse.Client, move_id: str, timeout: float = 90) -> dict:
    return wait_until(lambda: (m := client.moves.get(move_id))["state"] in ("done", "failed") and m,
                      timeout=timeout, interval=0.2, what=f"move {move_id} to end")


# ---- rL-2: a database stall mid-copy ---------------------------------------------------------

def _pg_pids(postgres) -> list[int]:
    pids = [int(p) for p in subprocess.run(["pgrep", "-f", str(postgres.dir)], capture_output=True,
                                           text=True).stdout.split()]
    kids = subprocess.run(["pgrep", "-P", ",".join(map(str, pids))], capture_output=True, text=True).stdout.split()
    return pids + [int(p) for p in kids]


@pytest.mark.postgres
@pytest.mark.timeout(240)
def test_a_database_stall_mid_copy_is_waited_out_by_the_driver_and_no_replica_takes_the_move(tmp_path, postgres):
    db = postgres.create_db("fuse_r36_stall")
    a = start_controller(tmp_path, db=db, name="ctl-a", env={"FUSE_TEST_CHUNK_DELAY": "1.0"})
    b = start_controller(tmp_path, db=db, name="ctl-b")
    agents = [start_agent(tmp_path, backend="fake", name=f"agent-{h}") for h in ("src", "dst")]
    frozen: list[int] = []
    try:
        with fuse.Client(a.url) as ca, fuse.Client(b.url) as cb:
            for h, ag in zip(("src", "dst"), agents):
                _register(ca, h, ag.url, ag.token)
            wait_until(lambda: all(h.connected for h in cb.hosts.list()), what="replica b sees the hosts")
            ca.vms.create(_vm("job", mem=2048, host="src"))  # (a 32 MiB memory image: 8 chunks, a second each)
            m = ca.moves.create("job", to="dst")
            wait_until(lambda: ca.moves.get(m["id"])["copied_bytes"] >= 8 << 20, timeout=60, interval=0.1,
                       what="the copy under way")
            frozen = _pg_pids(postgres)
            for p in frozen:
                os.kill(p, signal.SIGSTOP)
            time.sleep(8)
            for p in frozen:
                os.kill(p, signal.SIGCONT)
            frozen = []
            end = _ended(ca, m["id"])
            assert (end["state"], end["reason"]) == ("done", ""), end
            vm = ca.vms.get("job")
            assert (vm["host"], vm["state"]) == ("dst", "running"), vm
            time.sleep(2)  # (a take-over would come within a janitor pass or two)
        for p in (a, b):
            logs = p.logs()
            assert "taking over" not in logs, logs[-3000:]
            assert "Task exception was never retrieved" not in logs and "Traceback" not in logs, logs[-3000:]
        assert f"move {m['id']}: the database is out of reach" in a.logs(), a.logs()[-3000:]
        assert f"move {m['id']}: the database answers again" in a.logs(), a.logs()[-3000:]
    finally:
        for p in frozen:
            os.kill(p, signal.SIGCONT)
        for p in (a, b, *agents):
            p.stop()
        reap(tmp_path)


# ---- rL-3: the copy thread of a move taken over -------------------------------------------------

@pytest.mark.postgres
@pytest.mark.timeout(240)
def test_a_replica_whose_move_was_taken_over_stops_and_awaits_its_copy_thread(tmp_path, postgres):
    db = postgres.create_db("fuse_r36_takeover")
    a = start_controller(tmp_path, db=db, name="ctl-a", env={"FUSE_TEST_CHUNK_DELAY": "1.0"})
    b = start_controller(tmp_path, db=db, name="ctl-b")
    agents = [start_agent(tmp_path, backend="fake", name=f"agent-{h}") for h in ("src", "dst")]
    src = Proxy(agents[0].url)  # (counts what the source sends over the copy connections)
    try:
        with fuse.Client(a.url) as ca, fuse.Client(b.url) as cb:
            for h, url, ag in zip(("src", "dst"), (src.url, agents[1].url), agents):
                _register(ca, h, url, ag.token)
            wait_until(lambda: all(h.connected for h in cb.hosts.list()), what="replica b sees the hosts")
            ca.vms.create(_vm("job", mem=4096, host="src"))  # (64 MiB: 16 chunks, a second each)
            m = ca.moves.create("job", to="dst")
            wait_until(lambda: ca.moves.get(m["id"])["copied_bytes"] >= 4 << 20, timeout=60, interval=0.1,
                       what="the copy under way")
            try:
                for _ in range(4):
                    a.popen.send_signal(signal.SIGSTOP)
                    # (a replica frozen inside a transaction holds its locks, and b's claim waits on
                    # them: a is let run a moment and frozen again)
                    with contextlib.suppress(TimeoutError):
                        wait_until(lambda: "taking over" in b.logs(), timeout=15, interval=0.2, what="b's take-over")
                        break
                    a.popen.send_signal(signal.SIGCONT)
                    time.sleep(0.1)
                settled = _ended(cb, m["id"], timeout=60)
            finally:
                a.popen.send_signal(signal.SIGCONT)
            assert settled["state"] == "failed", settled
            wait_until(lambda: "stops driving it" in a.logs(), timeout=30, what="replica a to stop driving the move")
            # its copy thread was stopped and waited for before it said so: the source sends no more
            sent = src.bulk_bytes
            time.sleep(4)
            assert src.bulk_bytes - sent < 4 << 20, (sent, src.bulk_bytes)
            vm = cb.vms.get("job")
            assert (vm["host"], vm["state"]) == ("src", "running"), vm
        logs = a.logs()
        assert "Task exception was never retrieved" not in logs and "Traceback" not in logs, logs[-3000:]
    finally:
        a.popen.send_signal(signal.SIGCONT)
        src.close()
        for p in (a, b, *agents):
            p.stop()
        reap(tmp_path)


# ---- rM-3 / rM-4: answers that are not the agent's, and a slow link ---------------------------

class Proxy:
    """A TCP proxy in front of one agent (HTTP and the bulk protocol alike) that, for a request
    whose first bytes hold ``match``, answers ``reply`` in the agent's place (the request is
    passed on first, as a gateway would) or throttles it to ``rate`` bytes a second."""

    def __init__(self, upstream: str):
        host, port = upstream.removeprefix("http://").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.rules: list[dict] = []
        self.bulk_bytes = 0  # what the agent sent back over bulk copy connections
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)

            async def start() -> None:
                self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
                self.port = self.server.sockets[0].getsockname()[1]
                ready.set()

            self.loop.run_until_complete(start())
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        async def shut() -> None:
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    def _pick(self, data: bytes) -> dict | None:
        for r in self.rules:
            if r["match"] in data[:300] and r.get("times", 1) > 0:
                r["times"] = r.get("times", 1) - 1
                return r
        return None

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            sr, sw = await asyncio.open_connection(*self.upstream)
        except OSError:
            cw.close()
            return
        rule: dict = {}
        bulk = False

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter, out: bool) -> None:
            nonlocal rule, bulk
            while data := await r.read(65536):
                if out and data.split(b" ", 1)[0] in (b"GET", b"POST", b"PUT", b"DELETE", b"FUSE-BULK/1"):
                    rule = self._pick(data) or {}
                    bulk = data.startswith(b"FUSE-BULK/1")
                if not out and bulk:
                    self.bulk_bytes += len(data)
                if not out and rule.get("reply") is not None:
                    cw.write(rule["reply"])
                    await cw.drain()
                    cw.close()
                    sw.close()
                    return
                rate = rule.get("rate")
                for i in range(0, len(data), 4096 if rate else len(data)):
                    w.write(data[i:i + 4096] if rate else data)
                    await w.drain()
                    if rate:
                        await asyncio.sleep(4096 / rate)
            with_eof = getattr(w, "can_write_eof", lambda: False)()
            if with_eof:
                w.write_eof()

        try:
            await asyncio.gather(pump(cr, sw, True), pump(sr, cw, False))
        except (OSError, RuntimeError):
            pass
        finally:
            for w in (cw, sw):
                w.close()


@pytest.fixture
def proxied(tmp_path):
    """A controller (``env`` given on start) and two fake agents, src and dst, each reached
    through a `Proxy`."""
    made: list = []

    def start(env: dict | None = None):
        ctl = start_controller(tmp_path, env=env)
        agents = [start_agent(tmp_path, backend="fake", name=f"agent-{h}") for h in ("src", "dst")]
        proxies = [Proxy(ag.url) for ag in agents]
        made.extend([ctl, *agents, *proxies])
        client = fuse.Client(ctl.url)
        made.append(client)
        for h, ag, px in zip(("src", "dst"), agents, proxies):
            _register(client, h, px.url, ag.token)
        return client, {"src": proxies[0], "dst": proxies[1]}

    yield start
    for x in made:
        x.close() if isinstance(x, (Proxy, fuse.Client)) else x.stop()
    reap(tmp_path)


HTML_200 = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 6\r\nConnection: close\r\n\r\n<html>"
EMPTY_200 = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where,match,reply,said", [
    ("dst", b'"op": "write"', b"<html>nope</html>\n", "host dst answered the copy with a line that is not JSON"),
    ("dst", b'"op": "write"', b"[1]\n", "host dst answered the copy with a JSON list"),
    ("dst", b"/verify", EMPTY_200, "host dst answered the check of move"),
    ("src", b"/sleep", HTML_200, "host src answered the sleep of vm job with a 200 whose body is not JSON (text/html)"),
], ids=["bulk-reply-html", "bulk-reply-list", "verify-empty-object", "sleep-html"])
def test_a_move_failed_by_an_answer_not_the_agents_names_the_host_and_what_was_wrong(proxied, where, match, reply,
                                                                                     said):
    client, proxies = proxied()
    client.vms.create(_vm("job", host="src"))
    proxies[where].rules.append({"match": match, "reply": reply})
    end = _ended(client, client.moves.create("job", to="dst")["id"])
    assert end["state"] == "failed", end
    assert said in end["reason"], end["reason"]
    assert not any(w in end["reason"] for w in ("JSONDecodeError", "AttributeError", "KeyError")), end["reason"]
    vm = client.vms.get("job")
    assert (vm["host"], vm["state"]) == ("src", "running"), vm


@pytest.mark.timeout(120)
def test_a_copy_over_a_slow_link_is_said_too_slow_not_that_nothing_moved(proxied):
    client, proxies = proxied(env={"FUSE_MOVE_IO_TIMEOUT": "3"})
    client.vms.create(_vm("job", host="src"))  # (a 16 MiB memory image)
    # the bulk write to the target at 400 kB/s: a 4 MiB chunk takes ~10 s, bytes moving all along
    proxies["dst"].rules.append({"match": b'"op": "write"', "rate": 400_000, "times": 10})
    end = _ended(client, client.moves.create("job", to="dst")["id"])
    assert end["state"] == "failed", end
    assert "nothing moved" not in end["reason"], end["reason"]
    assert end["reason"] == ("the copy from src to dst was too slow: a 4 MiB chunk did not get through within 3 s "
                             "(FUSE_MOVE_IO_TIMEOUT), though both hosts answer"), end["reason"]
    vm = client.vms.get("job")
    assert (vm["host"], vm["state"]) == ("src", "running"), vm

