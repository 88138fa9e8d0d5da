"""Review 35 of the SDK: a short timeout tuple is a ValueError; the error helpers find an
ApiError that is the context of an exception with another cause; a PUT naming a thing with
a '/' is invalid_argument; and every list the SDK returns is checked to be the list of
records asked for (a catch-all's ``{"vms": {"a": 1}}`` or ``{"hosts": [{}]}`` is
``invalid_answer``, as a single record's is)."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

import fuse



class StandIn:
    """A loopback HTTP server answering every request 200 with the JSON ``body``."""

    def __init__(self):
        self.body = b"{}"
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(stand_in.body)))
                self.end_headers()
                self.wfile.write(stand_in.body)

            do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _any

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def stand_in():
    s = StandIn()
    yield s
    s.server.shutdown()
    s.server.server_close()


# ---- F1: a timeout tuple shorter than 2 -------------------------------------------------

@pytest.mark.parametrize("cls", [fuse.Client, fuse.AsyncClient])
@pytest.mark.parametrize("timeout", [(5,), ()])
def test_short_timeout_tuple_is_value_error(controller, cls, timeout):
    with pytest.raises(ValueError, match="is no httpx timeout"):
        cls(controller.url, timeout=timeout)
    cls(controller.url, timeout=(5, 5))  # (a 2-tuple still is one)


# ---- F2: an ApiError as the context of an exception with another cause -------------------

def test_helpers_find_the_api_error_in_the_context_beside_a_cause(client):
    try:
        try:
            client.hosts.get("no-such-host")
        except fuse.ApiError:
            raise RuntimeError("lookup failed") from KeyError("k")
    except RuntimeError as outer:
        assert isinstance(outer.__context__, fuse.ApiError) and isinstance(outer.__cause__, KeyError)
        assert fuse.is_not_found(outer)
        assert not fuse.is_conflict(outer) and not fuse.is_invalid_argument(outer)
        # deeper: the ApiError as the context of the cause of another exception
        try:
            raise ValueError("outermost") from outer
        except ValueError as top:
            assert fuse.is_not_found(top)


def test_helpers_end_on_a_cycle_without_an_api_error():
    a, b = RuntimeError("a"), KeyError("b")
    a.__cause__, a.__context__ = b, b
    b.__cause__, b.__context__ = a, a
    assert not fuse.is_not_found(a) and not fuse.is_conflict(b)


# ---- F3: a PUT naming a thing with a '/' -------------------------------------------------

@pytest.mark.parametrize("name", ["a/b", "x/y/z"])
def test_link_cloud_with_a_slash_is_invalid_argument(client, name):
    with pytest.raises(fuse.ApiError) as info:
        client.pool.link_cloud(name, "local")
    err = info.value
    assert (err.status, err.code) == (400, "invalid_argument"), err
    assert fuse.is_invalid_argument(err) and not fuse.is_not_found(err)
    assert "'/'" in err.message
    assert client.pool.clouds() == []  # (nothing linked)


def test_slashed_ids_of_existing_things_stay_not_found(controller, client):
    for call in (lambda: client.pool.unlink_cloud("a/b"), lambda: client.vms.get("a/b"),
                 lambda: client.vms.delete("a/b"), lambda: client.moves.get("a/b")):
        with pytest.raises(fuse.ApiError) as info:
            call()
        assert (info.value.status, info.value.code) == (404, "not_found"), info.value
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(controller.socket)), base_url="http://c") as raw:
        r = raw.put("/v1/pool/clouds/a%2Fb", json={"kind": "local", "options": {}})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument", r.text
        r = raw.put("/v1/vms/a%2Fb", json={})  # (no PUT route there: not a name check)
        assert r.status_code != 400, r.text
        r = raw.get("/v1/pool/clouds/a%2Fb/nosuch")  # (no route at all)
        assert r.status_code == 404, r.text


# ---- F4: lists that are not the records asked for ----------------------------------------

LISTS = {  # call -> the key its answer holds the list under
    "vms.list": ("vms", lambda c: c.vms.list()),
    "moves.list": ("moves", lambda c: c.moves.list()),
    "hosts.list": ("hosts", lambda c: c.hosts.list()),
    "hosts.list_page": ("hosts", lambda c: c.hosts.list_page()),
    "pool.clouds": ("clouds", lambda c: c.pool.clouds()),
    "pool.cloud_hosts": ("hosts", lambda c: c.pool.cloud_hosts()),
    "pool.cloud_add_host": ("hosts", lambda c: c.pool.cloud_add_host("local", "t")),
    "pool.cloud_reconcile": ("decisions", lambda c: c.pool.cloud_reconcile()),
    "pool.prewarms": ("prewarms", lambda c: c.pool.prewarms()),
}
BAD = [{"a": 1}, {}, "not a list", 7, None, [{}], [1], [[]], [{"x": 1}], ["s"]]


@pytest.mark.parametrize("name", sorted(LISTS))
def test_lists_not_of_records_are_invalid_answer(stand_in, name):
    key, call = LISTS[name]
    with fuse.Client(stand_in.url) as c:
        for bad in BAD:
            stand_in.body = json.dumps({key: bad}).encode()
            with pytest.raises(fuse.ApiError) as info:
                got = call(c)
                pytest.fail(f"{name} on {{{key!r}: {bad!r}}} returned {got!r}")
            assert (info.value.status, info.value.code) == (200, "invalid_answer"), info.value


@pytest.mark.parametrize("name", sorted(LISTS))
def test_lists_not_of_records_are_invalid_answer_async(stand_in, name):
    key, call = LISTS[name]

    async def main():
        async with fuse.AsyncClient(stand_in.url) as c:
            for bad in BAD:
                stand_in.body = json.dumps({key: bad}).encode()
                with pytest.raises(fuse.ApiError) as info:
                    got = await call(c)
                    pytest.fail(f"{name} on {{{key!r}: {bad!r}}} returned {got!r}")
                assert (info.value.status, info.value.code) == (200, "invalid_answer"), info.value

    asyncio.run(main())


def test_lists_of_a_real_controller_still_read(client):
    assert client.vms.list() == [] and client.moves.list() == [] and client.hosts.list() == []
    assert client.hosts.list_page().hosts == [] and client.pool.clouds() == []
    assert client.pool.cloud_hosts() == [] and client.pool.prewarms() == []
    linked = client.pool.link_cloud("lab", "local")
    assert [c["name"] for c in client.pool.clouds()] == [linked["name"]] == ["lab"]


# ---- review 36: the lists inside usage's and a drain's answers ------------------------------

USAGE_OK = {"from": 0, "to": 1, "vms": [{"host": "h", "vm": "v"}], "totals": {}, "hosts": ["h"],
            "aliases": {}, "unreachable": [], "unreachable_reasons": {}}
DRAIN_OK = {"host": "h", "moved": [{"vm": "v", "move": "m", "to": "t"}], "stuck": [{"vm": "w", "code": "c", "reason": "r"}],
            "finished": [{"vm": "x", "state": "exited"}], "prewarmed": ["p"]}
INNER_BAD = {  # call -> (a good answer, [the answer with one field spoilt])
    "usage": (lambda c: c.usage(), USAGE_OK, [
        {"vms": {"a": 1}}, {"vms": [1]}, {"vms": [{}]}, {"vms": [{"host": "h"}]}, {"totals": []},
        {"hosts": [1]}, {"unreachable": "h"}]),
    "hosts.drain": (lambda c: c.hosts.drain("h"), DRAIN_OK, [
        {"moved": {"v": 1}}, {"moved": [{"vm": "v"}]}, {"moved": ["v"]}, {"stuck": [{}]}, {"stuck": "w"},
        {"finished": [{"vm": "x"}]}, {"finished": [None]}, {"prewarmed": [{"p": 1}]}, {"prewarmed": "p"}]),
}


@pytest.mark.parametrize("name", sorted(INNER_BAD))
def test_the_lists_inside_usage_and_drain_answers_are_checked(stand_in, name):
    call, good, spoilt = INNER_BAD[name]
    with fuse.Client(stand_in.url) as c:
        stand_in.body = json.dumps(good).encode()
        assert call(c) == good
        for bad in spoilt:
            stand_in.body = json.dumps({**good, **bad}).encode()
            with pytest.raises(fuse.ApiError) as info:
                got = call(c)
                pytest.fail(f"{name} on {bad!r} returned {got!r}")
            assert (info.value.status, info.value.code) == (200, "invalid_answer"), info.value
