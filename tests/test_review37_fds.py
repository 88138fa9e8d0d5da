"""Review 37: a server out of file descriptors.

Idle connections (no token needed to open one) past the open-file limit: the head deadline
must still close them, whatever its look at them fails on (it imported ``termios`` as a late
timer ran, which needs a descriptor: it raised, nothing closed them, and the controller was
locked out, its owner-only socket too, until the clients let go); the loop's accept failures
are a line, not a traceback per try (~1.7 MB of log a second); and a server raises its soft
limit to the hard one as it starts.
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fuse import serving
from fuse.serving import serve
from support import FUSE, fake_bundle, free_port, wait_until


async def _app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _serving(port: int) -> asyncio.Task:
    task = asyncio.create_task(serve(_app, listen=f"127.0.0.1:{port}"))
    for _ in range(200):
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return task
        except OSError:
            await asyncio.sleep(0.05)
    raise TimeoutError("the server did not start")


async def _closed_by_server(reader: asyncio.StreamReader, within: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), within) == b""
    except (asyncio.TimeoutError, ConnectionError):
        return False


def _block_loop(seconds: float) -> None:
    time.sleep(seconds)  # (on purpose: the loop is held, so the server's timers run late, as under an accept storm)


def _no_termios(monkeypatch) -> None:
    """``import termios`` fails from now on, as it does with no descriptor free to open it with."""
    monkeypatch.setitem(sys.modules, "termios", None)


def _failing_look(monkeypatch) -> None:
    def fail(transport):
        raise OSError(24, "Too many open files")
    monkeypatch.setattr(serving, "_bytes_waiting", fail)


@pytest.mark.parametrize("breaks", [_no_termios, _failing_look],
                         ids=["with termios not importable (no descriptor free)", "with its look at the bytes failing"])
async def test_a_late_head_deadline_closes_a_silent_connection_even_when_its_look_at_it_fails(
        monkeypatch, breaks):
    monkeypatch.setenv("FUSE_HTTP_HEAD_TIMEOUT_S", "1")
    port = free_port()
    server = await _serving(port)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.sleep(0.3)  # (accepted: its head timer armed)
        breaks(monkeypatch)
        _block_loop(2.5)  # the timer, due in 1 s, runs 1.5 s late: it looks for bytes waiting
        assert await _closed_by_server(reader, 10), "the silent connection was never closed"
        writer.close()
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)


async def test_a_late_keep_alive_timer_closes_an_idle_connection_even_when_termios_cannot_be_imported(
        monkeypatch):
    monkeypatch.setenv("FUSE_HTTP_HEAD_TIMEOUT_S", "60")  # (the head deadline out of the way: uvicorn's 5 s keep-alive closes it)
    port = free_port()
    server = await _serving(port)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"ok"), 10)
        assert head.startswith(b"HTTP/1.1 200")
        _no_termios(monkeypatch)
        _block_loop(6.5)  # the keep-alive timer, due in 5 s, runs late
        assert await _closed_by_server(reader, 15), "the idle connection was never closed"
        writer.close()
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)


def _start(kind: str, tmp: Path, soft: int, hard: int) -> tuple[subprocess.Popen, int, Path, Path]:
    """A controller or an agent (its own python, not the suite's fork server: the first import
    of what its late timers use must happen in it) under an open-file limit of ``soft``/``hard``."""
    port, sock, log = free_port(), tmp / f"{kind}.sock", tmp / f"{kind}.log"
    if kind == "controller":
        args = ["controller", "serve", "--state-dir", str(tmp / "state")]
    else:
        fake_bundle(tmp / "state")
        args = ["host", "serve", "--state-dir", str(tmp / "state"), "--backend", "fake"]
    args += ["--socket", str(sock), "--listen", f"127.0.0.1:{port}", "--token", "t"]
    env = {**os.environ, "FUSE_HTTP_HEAD_TIMEOUT_S": "3"}
    with open(log, "ab") as fh:
        p = subprocess.Popen(
            FUSE + args, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)))
    try:
        wait_until(lambda: p.poll() is None and _answers(sock) == 200, timeout=60,
                   what=f"{kind} ({log.read_text()[-800:] if log.exists() else ''})")
    except BaseException:
        _stop(p)
        raise
    return p, port, sock, log


def _answers(sock: Path) -> int:
    """The status of a call over the owner-only socket (the operator's way in)."""
    path = "/v1/healthz" if sock.name.startswith("controller") else "/v1/host"
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://c") as c:
        return c.get(path, timeout=5).status_code


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def _nofile(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-file limit in /proc/PID/limits")


@pytest.mark.parametrize("kind", ["controller", "agent"])
def test_a_server_out_of_descriptors_closes_silent_connections_answers_again_and_logs_a_line(tmp_path, kind):
    limit = 64
    p, port, sock, log = _start(kind, tmp_path, limit, limit)
    conns: list[socket.socket] = []
    try:
        for _ in range(3 * limit):  # silent, no token: past the limit, most wait in the listen queue
            conns.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        pending = list(conns)

        def all_closed_by_the_server() -> bool:
            for s in list(pending):
                s.settimeout(0.01)
                try:
                    if s.recv(1) != b"":
                        continue
                except (TimeoutError, socket.timeout, BlockingIOError):
                    continue
                except ConnectionError:
                    pass
                pending.remove(s)
            return not pending

        # 3 s a round: each round closes the connections that took the descriptors free
        wait_until(all_closed_by_the_server, timeout=90, interval=0.5,
                   what=f"the silent connections closed by the server ({len(pending)} not)")
        assert _answers(sock) == 200
        size = os.path.getsize(log)
        assert size < 64 * 1024, f"{size} bytes of log"  # (asyncio's traceback each try: megabytes)
        text = log.read_text(errors="replace")
        no_head_failed = "_no_head" in text  # (booleans: pytest's repr of megabytes of log took minutes)
        assert not no_head_failed, "the head deadline's timer raised"
        # (said once accepts have worked a few seconds with none failing)
        wait_until(lambda: "accepting connections works again" in log.read_text(errors="replace"), timeout=30,
                   what="the line saying accepts work again")
        assert 1 <= log.read_text(errors="replace").count("accepting connections fails") <= 3  # (not a line a try)
    finally:
        for s in conns:
            s.close()
        _stop(p)


def test_a_controller_raises_its_soft_open_file_limit_to_the_hard_one(tmp_path):
    hard = min(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    p, _, _, log = _start("controller", tmp_path, 256, hard)
    try:
        assert _nofile(p.pid) == (hard, hard)
        if hard < serving.LOW_NOFILE:
            assert f"the open-file limit is {hard}" in log.read_text()
    finally:
        _stop(p)
