"""Review 38 of the SDK as an application uses it: a client used across ``os.fork()`` never
hands one process the other's answer; a type checker sees the SDK (``py.typed``, the
resources, the async client's awaitables); a request sent whose answer never came says it
may have been carried out; HTTP(S)_PROXY is read as Go's tools read it (never for
loopback); an ApiError survives pickling; a closed client, or an AsyncClient in a second
event loop, is no bare RuntimeError."""

from __future__ import annotations

import asyncio
import inspect
import multiprocessing
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

import fuse
from fuse.client import _core
from support import start_controller


def _closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- 1: a client across os.fork() ---------------------------------------------------------

def _fork_asking(asks, out) -> int:
    """Fork; the child writes what ``asks()`` got wrong (or its exception) to ``out`` and leaves
    at once (no pytest teardown in it). The child's pid."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            try:
                wrong = asks()
            except Exception as exc:
                wrong = [f"{type(exc).__name__}: {exc}"]
            out.write_text("\n".join(wrong))
            code = 0
        finally:
            os._exit(code)
    return pid


def _asks(client: fuse.Client, who: str, n: int) -> list[str]:
    """``n`` lookups of VMs named after ``who``: what went wrong in each (the controller's
    not_found names the VM asked for, so an answer to another request shows)."""
    wrong = []
    for i in range(n):
        name = f"{who}{i}"
        try:
            got = client.vms.get(name)
            wrong.append(f"asked {name}, got the VM {got!r}")
        except fuse.ApiError as err:
            if err.code != "not_found" or name not in err.message.split():
                wrong.append(f"asked {name}, got {err}")
    return wrong


def test_a_forked_child_and_its_parent_each_get_their_own_answers(controller, tmp_path):
    with fuse.Client(controller.url) as client:
        client.vms.list()  # (a kept-alive connection in the pool, which the child inherits)
        out = tmp_path / "child.txt"
        pid = _fork_asking(lambda: _asks(client, "child-", 60), out)
        parent_wrong = _asks(client, "parent-", 60)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert (parent_wrong, out.read_text()) == ([], "")
        assert client.vms.list() == []  # (the parent's client still works)


def test_a_forked_async_client_opens_its_own_connections(controller, tmp_path):
    async def asks(client: fuse.AsyncClient, who: str) -> list[str]:
        wrong = []
        for i in range(40):
            name = f"{who}{i}"
            try:
                wrong.append(f"asked {name}, got {await client.vms.get(name)!r}")
            except fuse.ApiError as err:
                if err.code != "not_found" or name not in err.message.split():
                    wrong.append(f"asked {name}, got {err}")
        return wrong

    client = fuse.AsyncClient(controller.url)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(client.vms.list())
        out = tmp_path / "child.txt"  # (the child in a loop of its own, as a forked worker starts one)
        pid = _fork_asking(lambda: asyncio.run(asks(client, "child-")), out)
        parent_wrong = loop.run_until_complete(asks(client, "parent-"))
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert (parent_wrong, out.read_text()) == ([], "")
        loop.run_until_complete(client.aclose())
    finally:
        loop.close()


# ---- 2: a type checker sees the SDK ------------------------------------------------------

APP = '''
from __future__ import annotations

import asyncio

import httpx

import fuse
from fuse import ApiError, Host


def sync_main(agent_token: str) -> None:
    client = fuse.Client("unix:///run/fuse-controller.sock")
    host = client.hosts.register(fuse.RegisterHostRequest(
        id="prod-east-1", url="http://10.0.0.5:8090", token=agent_token,
        region="us-east", backend="firecracker",
        capacity=fuse.HostCapacity(vm_count=20)))
    for w in host.warnings:
        print("warning:", w)

    vm = client.vms.create({"shape": {"vcpus": 2, "mem_mib": 1024}, "entry": "python3 job.py"})
    move = client.moves.create(vm["name"], to="prod-east-2")
    for event in client.events.follow(since=0):
        print(event["host"], event["type"])
    print(client.usage(from_=1761955200)["totals"])
    plan = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=12, cpus=2, memory_mb=2048))
    client.controller.configure(cert="ctl.pem", key="ctl.key", ca="ca.pem")
    print(move["state"], plan.model_dump(), client.health()["status"])
    try:
        client.hosts.get("x")
    except ApiError as err:
        print(err.status, err.code, err.message, err.details, fuse.is_not_found(err))
    for timeout in (None, 5, 2.5, httpx.Timeout(5)):
        with fuse.Client("http://127.0.0.1:8080", token="t", timeout=timeout) as c:
            hosts: list[Host] = c.hosts.list()
            print(hosts)


async def async_main() -> None:
    async with fuse.AsyncClient("http://127.0.0.1:8080", token="t", timeout=None) as c:
        vms = await c.vms.list()
        hosts: list[Host] = await c.hosts.list()
        h: Host = await c.hosts.get("h1")
        print(vms[0]["name"], hosts, h.id, (await c.usage())["totals"], (await c.health())["status"])
        async for e in c.events.follow(since=0, max_events=1):
            print(e["type"])
        async for e in c.events.afollow(since=0):
            print(e["type"])
        budget = await c.pool.cloud_budget()
        print(budget, await c.moves.get("m1"), await c.controller.get())


def wrong() -> None:
    async def unawaited(c: fuse.AsyncClient) -> None:
        h: Host = c.hosts.get("h1")  # WRONG: an awaitable, not a Host
        print(h)
    fuse.HostCapacity(vm_count="three")  # WRONG: not an int


if __name__ == "__main__":
    sync_main("t")
    asyncio.run(async_main())
'''


def test_the_readme_sdk_example_passes_mypy_strict(tmp_path):
    pytest.importorskip("mypy", reason="mypy comes with the test extra")
    (tmp_path / "app.py").write_text(APP)
    # mypy finds fuse as an installed package (where py.typed counts) on a path of this process's
    # entries, the fuse under test first and no other copy of it (a .pth of an editable install
    # elsewhere, say): -S keeps the interpreter's site from adding one back.
    src = Path(fuse.__file__).parents[1]
    path = [str(src)] + [p for p in sys.path if p and os.path.isdir(p) and not os.path.isdir(os.path.join(p, "fuse"))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    env.pop("MYPYPATH", None)
    r = subprocess.run([sys.executable, "-S", "-m", "mypy", "--strict", "--no-error-summary", "--cache-dir",
                        str(tmp_path / "cache"), "app.py"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=240)
    wrong_lines = {i for i, line in enumerate(APP.splitlines(), 1) if "# WRONG" in line}
    errors = [line for line in r.stdout.splitlines() if ": error:" in line]
    # the app's correct lines pass; its two wrong ones are flagged (fuse is checked, not Any)
    assert [e for e in errors if int(e.split(":")[1]) not in wrong_lines] == [], r.stdout + r.stderr
    assert {int(e.split(":")[1]) for e in errors} == wrong_lines, r.stdout + r.stderr


def test_the_async_typing_matches_the_resources():
    """The protocols the type checker sees for the async client hold the sync classes'
    methods, parameter for parameter (runtime is those classes)."""
    from fuse.client import _typing
    from fuse.client.controller import ControllerAPI
    from fuse.client.events import AsyncEventsAPI
    from fuse.client.hosts import HostsAPI
    from fuse.client.moves import MovesAPI
    from fuse.client.pool import PoolAPI
    from fuse.client.vms import VmsAPI

    def methods(cls: type) -> dict[str, list[tuple[str, object, object]]]:
        return {name: [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]
                for name, fn in inspect.getmembers(cls, callable) if not name.startswith("_")}

    for cls, proto in [(HostsAPI, _typing.AsyncHostsAPI), (VmsAPI, _typing.AsyncVmsAPI),
                       (MovesAPI, _typing.AsyncMovesAPI), (AsyncEventsAPI, _typing.AsyncEventsAPI),
                       (PoolAPI, _typing.AsyncPoolAPI), (ControllerAPI, _typing.AsyncControllerAPI)]:
        assert methods(proto) == methods(cls), cls.__name__
    with fuse.Client("http://127.0.0.1:9") as c:  # (and usage/health as the client has them)
        for fn, proto in ((c.usage, _typing.Usage), (c.health, _typing.Health)):
            want = [p.name for p in inspect.signature(proto.__call__).parameters.values()][1:]
            assert [p.name for p in inspect.signature(fn).parameters.values()] == want


# ---- 3: a request sent whose answer never came -------------------------------------------

class Hangup:
    """A loopback server that reads each request whole, then closes without answering:
    a controller that died with the request in hand."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.got: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536) or b"\r\n\r\n"
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    body += conn.recv(65536) or b"x" * length
                self.got.append(head.split(b"\r\n")[0])


@pytest.fixture
def hangup():
    h = Hangup()
    yield h
    h.sock.close()


def _unreachable(call) -> fuse.ApiError:
    with pytest.raises(fuse.ApiError) as got:
        call()
    assert (got.value.status, got.value.code) == (0, "unreachable")
    return got.value


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_create_sent_but_not_answered_may_have_been_carried_out(hangup, asynchronous):
    shape = {"shape": {"vcpus": 1, "mem_mib": 128}}
    if asynchronous:
        async def create():
            async with fuse.AsyncClient(hangup.url, "t") as c:
                return await c.vms.create(shape)
        err = _unreachable(lambda: asyncio.run(create()))
    else:
        with fuse.Client(hangup.url, "t") as c:
            err = _unreachable(lambda: c.vms.create(shape))
    assert hangup.got == [b"POST /v1/vms HTTP/1.1"]
    assert err.details == {"sent": True}
    assert "cannot reach" not in err.message, err.message
    assert err.message.startswith(f"the controller at {hangup.url} closed the connection before answering")
    assert err.message.endswith("the request was sent and may have been carried out")


def test_a_request_never_sent_says_so():
    port = _closed_port()
    with fuse.Client(f"http://127.0.0.1:{port}", "t") as c:
        err = _unreachable(lambda: c.vms.create(shape={"vcpus": 1}))
    assert err.details == {"sent": False}
    assert err.message.startswith(f"cannot reach the controller at http://127.0.0.1:{port}: ")


def test_an_answer_not_in_time_after_sending_may_have_been_carried_out():
    quiet = socket.create_server(("127.0.0.1", 0))  # (accepts, reads nothing, never answers)
    try:
        url = f"http://127.0.0.1:{quiet.getsockname()[1]}"
        with fuse.Client(url, "t", timeout=0.5) as c:
            err = _unreachable(c.vms.list)
    finally:
        quiet.close()
    assert err.details == {"sent": True}
    assert err.message == (f"the controller at {url} did not answer in time: the request was sent and may have "
                           "been carried out")


# ---- 4: HTTP(S)_PROXY as Go's tools read it ---------------------------------------------

@pytest.fixture
def proxy_env(monkeypatch):
    """HTTP(S)_PROXY at a port nothing listens on; NO_PROXY unset."""
    proxy = f"http://127.0.0.1:{_closed_port()}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, proxy)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    return proxy


@pytest.fixture
def tcp_controller(tmp_path):
    p = start_controller(tmp_path, listen=True, token="ctok")
    yield p
    p.stop()


def test_a_proxy_in_the_environment_is_not_used_for_a_loopback_controller(tcp_controller, proxy_env):
    port = tcp_controller.extra["port"]
    for url in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
        with fuse.Client(url, "ctok") as c:
            assert c.vms.list() == []

        async def listed(url=url):
            async with fuse.AsyncClient(url, "ctok") as c:
                return await c.vms.list()
        assert asyncio.run(listed()) == []


def test_a_proxy_in_use_is_named_in_the_error(proxy_env):
    with fuse.Client("http://10.255.255.1:9", "t") as c:  # (the proxy refuses: nothing leaves this machine)
        err = _unreachable(c.vms.list)
    assert err.message.startswith(f"cannot reach the controller at http://10.255.255.1:9 "
                                  f"(through the proxy {proxy_env}): ")
    assert err.details == {"sent": False}


@pytest.mark.parametrize("url, no_proxy, proxied", [
    ("http://10.1.2.3:8080", "", True),
    ("https://fuse.example.com", "", True),
    ("http://127.0.0.1:8080", "", False),
    ("http://127.9.9.9:8080", "", False),
    ("http://[::1]:8080", "", False),
    ("http://localhost:8080", "", False),
    ("http://ctl.localhost:8080", "", False),
    ("http://10.1.2.3:8080", "10.0.0.0/8", False),
    ("http://10.1.2.3:8080", "10.1.2.3", False),
    ("http://10.1.2.3:8080", "10.1.2.4, 192.168.0.0/16", True),
    ("http://a.example.com:8080", "example.com", False),
    ("http://a.example.com:8080", ".example.com", False),
    ("http://example.com:8080", ".example.com", False),
    ("http://notexample.com:8080", "example.com", True),
    ("http://a.example.com:8080", "example.com:9090", True),
    ("http://a.example.com:8080", "example.com:8080", False),
    ("http://a.example.com:8080", "*", False),
], ids=lambda v: str(v))
def test_which_controller_urls_go_through_the_proxy(proxy_env, monkeypatch, url, no_proxy, proxied):
    monkeypatch.setenv("NO_PROXY", no_proxy)
    assert _core.proxy_for(url, None) == (proxy_env if proxied else None)
    with fuse.Client(url) as c:
        assert c._proxy == (proxy_env if proxied else None)
    assert _core.proxy_for("http://fuse", "/run/c.sock") is None  # (a unix socket never)


def test_a_proxy_given_as_host_port_is_an_http_proxy(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "proxy.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert _core.proxy_for("http://10.1.2.3:8080", None) == "http://proxy.example:3128"


def test_the_mcp_server_reads_the_proxy_as_the_sdk_does(proxy_env):
    from fuse.mcp.server import ControllerCaller

    assert ControllerCaller("http://127.0.0.1:9", "t").proxy is None
    far = ControllerCaller("http://10.1.2.3:9", "t")
    assert far.proxy == proxy_env and far.where == f"http://10.1.2.3:9 (through the proxy {proxy_env})"


# ---- 5: an ApiError pickles --------------------------------------------------------------

def _raise_not_found():
    raise fuse.ApiError(404, "not_found", "host zz not found", {"hosts": {"h1": "full"}})


def _same(a: fuse.ApiError, b: fuse.ApiError) -> None:
    assert type(a) is type(b)
    assert (a.status, a.code, a.message, a.details, a.args, str(a)) == \
        (b.status, b.code, b.message, b.details, b.args, str(b))


def test_an_api_error_pickles_to_an_equal_one():
    for err in (fuse.ApiError(409, "fleet_full", "full", {"hosts": {"h1": "no room"}}), fuse.ApiError(0),
                fuse.ApiError(404, "not_found", "host zz not found")):
        back = pickle.loads(pickle.dumps(err))
        _same(back, err)
        assert str(back) == f"{err.status} {err.code}: {err.message}"


def test_an_api_error_from_a_worker_process_is_the_one_raised():
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        with pytest.raises(fuse.ApiError) as got:
            pool.submit(_raise_not_found).result(timeout=60)
    _same(got.value, fuse.ApiError(404, "not_found", "host zz not found", {"hosts": {"h1": "full"}}))
    assert fuse.is_not_found(got.value)


# ---- 6: a closed client; an AsyncClient in a second event loop -------------------------

def test_a_call_on_a_closed_client_is_a_value_error(controller):
    c = fuse.Client(controller.url)
    c.vms.list()
    c.close()
    with pytest.raises(ValueError, match="^this fuse client is closed$"):
        c.vms.list()

    async def closed_then_called():
        a = fuse.AsyncClient(controller.url)
        await a.vms.list()
        await a.aclose()
        await a.hosts.list()
    with pytest.raises(ValueError, match="^this fuse client is closed$"):
        asyncio.run(closed_then_called())


def test_an_async_client_works_in_a_second_event_loop(tcp_controller):
    client = fuse.AsyncClient(f"http://127.0.0.1:{tcp_controller.extra['port']}", "ctok")
    assert asyncio.run(client.vms.list()) == []  # (its kept-alive connection belongs to this loop)
    assert asyncio.run(client.vms.list()) == []
    assert asyncio.run(client.hosts.list()) == []
    asyncio.run(client.aclose())


def test_close_from_another_thread_ends_a_follow_in_its_long_poll(controller):
    client = fuse.Client(controller.url)
    since = client.events.list()["next_cursor"]
    got: list[BaseException] = []

    def follow():
        try:
            for _ in client.events.follow(since=since, wait_s=30):
                pass
        except BaseException as exc:
            got.append(exc)

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    time.sleep(1.5)  # (the follow is in its long poll by now: nothing comes on a fleet of no hosts)
    began = time.monotonic()
    client.close()
    t.join(25)
    took = time.monotonic() - began
    assert not t.is_alive() and len(got) == 1
    assert isinstance(got[0], ValueError) and str(got[0]) == "this fuse client is closed", repr(got[0])
    assert took < 20, took  # (not the long poll's 30 s: its socket was shut down)



@pytest.mark.parametrize("url", ["http://[::1%25lo]:21000", "http://[::1%lo]:21000", "https://[fe80::1%eth0]:8443"])
def test_a_url_with_an_ipv6_zone_id_is_a_value_error_where_the_client_is_made(url):
    """A zone id passed the url's check and every call was "unreachable ... Name or service not
    known" (httpx hands the text to the resolver): refused where the client is made, as the
    controller refuses a host address with one."""
    with pytest.raises(ValueError, match="zone id"):
        fuse.Client(url)
    with pytest.raises(ValueError, match="zone id"):
        fuse.AsyncClient(url)


def test_an_unreachable_error_through_a_proxy_does_not_show_its_password(monkeypatch):
    """A proxy's user and password in HTTP_PROXY were printed in every `unreachable` error (the
    CLI's stderr, the MCP tool's answers: the diff review)."""
    port = _closed_port()
    monkeypatch.setenv("HTTP_PROXY", f"http://alice:s3cret@127.0.0.1:{port}")
    with fuse.Client("http://fuse-controller.example:8080", timeout=5) as c:
        with pytest.raises(fuse.ApiError) as err:
            c.vms.list()
    assert f"through the proxy http://127.0.0.1:{port}" in err.value.message, err.value.message
    assert "s3cret" not in str(err.value) and "alice" not in str(err.value)
