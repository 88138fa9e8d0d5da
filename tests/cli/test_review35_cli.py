"""Review 35 of the CLI (rI): `fuse controller events` on an answer that is not the API's was a
traceback (text) or printed as an event (--json), as the SDK took `{"events": [5]}`; following
with `--wait-s 0` asked the controller back-to-back with no pause; `hosts add` had no `--arch`;
`fuse pool` blamed `--url` for a bad `--token`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import fuse
from support import FUSE, free_port

NOBODY = f"http://127.0.0.1:{free_port()}"  # (an address nothing listens at)


def _run(args: list[str], env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(FUSE + args, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


class Stub:
    """A loopback server answering every request 200 with one JSON body (a proxy's catch-all,
    or a url that is no fuse controller), counting the event polls it is asked."""

    def __init__(self, body):
        self.body, self.polls = json.dumps(body).encode(), 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path.startswith("/v1/events"):
                    stub.polls += 1
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(stub.body)))
                self.end_headers()
                self.wfile.write(stub.body)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub(request):
    s = Stub(request.param)
    yield s
    s.stop()


NOT_EVENTS = [
    {"events": [{"id": 1, "type": "x", "host": None}], "next_cursor": 1},  # no time (the reviewer's)
    {"events": [5], "next_cursor": 1},  # not an object
    {"events": [{"id": 1, "time": 1.5, "type": "x"}], "next_cursor": 1},  # no host
    {"events": [{"id": "1", "time": 1.5, "type": "x", "host": "h"}], "next_cursor": 1},  # id no number
    {"events": [{"id": 1, "time": None, "type": "x", "host": "h"}], "next_cursor": 1},
    {"events": [{"id": 1, "time": 1.5, "type": "x", "host": "h"}], "next_cursor": "1"},  # cursor no number
]


@pytest.mark.parametrize("stub", NOT_EVENTS, indirect=True)
@pytest.mark.parametrize("mode", [["--no-follow"], ["--no-follow", "--json"], ["--wait-s", "1"]])
def test_events_not_the_apis_is_one_invalid_answer_line(stub, mode):
    """(review 35: text mode a KeyError/AttributeError traceback, --json printed the item as an event)"""
    as_json = "--json" in mode
    r = _run(["controller", "--url", stub.url, "events"] + mode, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    assert r.stdout == "", r.stdout  # (nothing printed as an event)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    if as_json:
        err = json.loads(r.stderr)["error"]
        code, message = err["code"], err["message"]
    else:
        assert r.stderr.startswith("error: "), r.stderr
        code, _, message = r.stderr.strip().removeprefix("error: ").partition(": ")
    assert code == "invalid_answer", r.stderr
    assert message.startswith("GET /v1/events was answered 200 with a body that is not the API's"), message


@pytest.mark.parametrize("stub", NOT_EVENTS[:2], indirect=True)
def test_sdk_events_list_and_follow_refuse_items_that_are_no_events(stub):
    """(review 35: `client.events.list` handed back `{"events": [5]}` as a page)"""
    with fuse.Client(stub.url) as c:
        with pytest.raises(fuse.ApiError) as got:
            c.events.list(0)
        assert got.value.code == "invalid_answer" and got.value.status == 200, got.value
        with pytest.raises(fuse.ApiError) as got:
            next(iter(c.events.follow(0, wait_s=0)))
        assert got.value.code == "invalid_answer", got.value

    async def main():
        async with fuse.AsyncClient(stub.url) as c:
            with pytest.raises(fuse.ApiError) as got:
                await c.events.list(0)
            assert got.value.code == "invalid_answer", got.value
            with pytest.raises(fuse.ApiError) as got:
                async for _ in c.events.follow(0, wait_s=0):
                    break
            assert got.value.code == "invalid_answer", got.value
    asyncio.run(main())


def test_real_events_still_list_follow_and_print(tmp_path, controller):
    """The checks take the controller's own events: text, --json and following, each one printed."""
    env = {"FUSE_URL": controller.url}
    added = _run(["controller", "hosts", "add", "--name", "h1", "--addr", NOBODY, "--cpus", "2",
                  "--ram-mb", "1000", "--storage-gb", "2", "--backend", "qemu"], env)
    assert added.returncode == 0, added.stderr
    with fuse.Client(controller.url) as c:
        page = c.events.list(0)
        assert any(e["type"] == "host_added" and e["host"] == "h1" for e in page["events"]), page
        first = next(iter(c.events.follow(0, wait_s=0)))
        assert first == page["events"][0]
    text = _run(["controller", "events", "--no-follow"], env)
    assert text.returncode == 0 and "Traceback" not in text.stderr, text.stderr
    assert "host_added" in text.stdout and " h1 " in text.stdout, text.stdout
    lines = _run(["controller", "events", "--no-follow", "--json"], env)
    assert lines.returncode == 0, lines.stderr
    assert [json.loads(x) for x in lines.stdout.splitlines()] == page["events"]


@pytest.mark.parametrize("stub", [{"events": [], "next_cursor": 0, "next": 0}], indirect=True)
def test_following_with_wait_s_0_pauses_between_empty_polls(stub):
    """(review 35: `events --wait-s 0` asked GET /v1/events back-to-back, a third of a core of the
    controller's for one idle follower; now at most one poll a second while nothing comes)"""
    p = subprocess.Popen(FUSE + ["controller", "--url", stub.url, "events", "--wait-s", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while stub.polls == 0 and time.monotonic() < deadline:  # (the CLI started, and asked once)
            time.sleep(0.05)
        assert stub.polls, "the follow never asked"
        first = stub.polls
        time.sleep(3)
        assert p.poll() is None, p.communicate()
        asked = stub.polls - first
    finally:
        p.kill()
        p.communicate()
    assert asked <= 4, asked  # (before: over a thousand in 3 s)

    async def main():  # the async client's follow, the same rule
        async with fuse.AsyncClient(stub.url) as c:
            async def follow():
                async for _ in c.events.follow(0, wait_s=0):
                    pass
            task = asyncio.create_task(follow())
            await asyncio.sleep(3)
            task.cancel()
    before = stub.polls
    asyncio.run(main())
    assert 1 <= stub.polls - before <= 4, stub.polls - before


def test_following_with_wait_s_0_still_sees_what_comes(tmp_path, controller):
    """The pause is after an empty page only: a follow with wait_s 0 still yields each event as it comes."""
    got: list = []

    def follow():
        with fuse.Client(controller.url) as c:
            for e in c.events.follow(0, wait_s=0):
                got.append(e)
                if {"h1", "h2"} <= {x["host"] for x in got if x["type"] == "host_added"}:
                    return
    t = threading.Thread(target=follow, daemon=True)
    t.start()
    time.sleep(1.5)  # (a few empty polls first)
    with fuse.Client(controller.url) as c:
        for name in ("h1", "h2"):
            c.hosts.register({"id": name, "url": NOBODY, "backend": "qemu",
                              "capacity": {"cpus": 2, "ram_mb": 1000, "storage_gb": 2, "vm_count": 4}})
    t.join(15)
    assert not t.is_alive(), got


@pytest.mark.parametrize("as_json", [False, True])
def test_hosts_add_declares_arch(tmp_path, controller, as_json):
    """(review 35: README says `hosts add` takes every field of the register request; `--arch`
    was "No such option", so a host added offline could not be given its architecture)"""
    env = {"FUSE_URL": controller.url}
    r = _run(["controller", "hosts", "add", "--name", "ar1", "--addr", NOBODY, "--cpus", "2", "--ram-mb", "1000",
              "--storage-gb", "2", "--backend", "qemu", "--arch", "arm64"] + (["--json"] if as_json else []), env)
    assert r.returncode == 0, r.stdout + r.stderr
    with fuse.Client(controller.url) as c:
        assert c.hosts.get("ar1").capacity.arch == "arm64"
    if as_json:
        assert json.loads(r.stdout)["capacity"]["arch"] == "arm64", r.stdout


def test_hosts_add_has_a_flag_for_every_declarable_field():
    """README: `hosts add` "takes every field of the register request" (the GPU inventory and the
    firecracker versions are the agent's to report: a declared value is ignored)."""
    from fuse.controller.hosts import INVENTORY
    from fuse.models.hosts import HostCapacity, RegisterHostRequest
    text = _run(["controller", "hosts", "add", "--help"], {"COLUMNS": "300", "TERM": "dumb"}).stdout
    reported = set(INVENTORY) | {"firecracker", "firecracker_pinned"}
    fields = (set(RegisterHostRequest.model_fields) - {"id", "url", "token", "capacity"}) | (
        set(HostCapacity.model_fields) - reported)
    flags = {"--" + f.replace("_", "-") for f in fields}
    missing = sorted(f for f in flags if f not in text)
    assert not missing, missing


@pytest.mark.parametrize("as_json", [False, True])
def test_pool_names_the_token_for_a_bad_token(as_json):
    """(review 35: `fuse pool` said "--url: the controller token holds a newline")"""
    r = _run(["pool", "--url", NOBODY, "--token", "a\nb", "hosts"] + (["--json"] if as_json else []))
    assert r.returncode == 2, r.stdout + r.stderr
    if as_json:
        message = json.loads(r.stderr)["error"]["message"]
    else:
        assert r.stderr.startswith("error: invalid_argument: "), r.stderr
        message = r.stderr.strip().removeprefix("error: invalid_argument: ")
    assert message.startswith("the controller token holds a newline"), message
    assert "--url" not in message, message
    same = _run(["controller", "--url", NOBODY, "--token", "a\nb", "hosts", "list"] + (["--json"] if as_json else []))
    assert same.returncode == 2 and same.stderr == r.stderr, (same.stderr, r.stderr)
    # a bad url is still said as the url's
    bad = _run(["pool", "--url", "http://a..b:1", "hosts"])
    assert bad.returncode == 2 and bad.stderr.startswith("error: invalid_argument: url 'http://a..b:1'"), bad.stderr
