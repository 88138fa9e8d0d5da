"""Review 30 of the SDK against servers that are not the API (a proxy's catch-all, a
broken encoder, a server that hangs), and against a real controller and agent: such
answers are ``invalid_answer``, never a success or a "not found"."""

from __future__ import annotations

import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import fuse
from support import start_agent, start_controller


class StandIn:
    """A loopback HTTP server answering every request with ``answer`` (status, headers, body),
    after ``delay`` seconds."""

    def __init__(self):
        self.answer: tuple[int, dict[str, str], bytes] = (200, {}, b"")
        self.delay = 0.0
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self):
                time.sleep(stand_in.delay)
                status, headers, body = stand_in.answer
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = do_PUT = _any

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


def _error(fn, *a, **kw) -> fuse.ApiError:
    with pytest.raises(fuse.ApiError) as info:
        fn(*a, **kw)
    return info.value


@pytest.mark.parametrize("body", [b"hello", b"{}"])
def test_calls_answered_with_no_body_take_no_catch_all_200_for_done(stand_in, body):
    stand_in.answer = (200, {"Content-Type": "application/json"}, body)
    with fuse.Client(stand_in.url) as c:
        for call in (lambda: c.hosts.cordon("h1"), lambda: c.hosts.uncordon("h1"),
                     lambda: c.hosts.deregister("h1"), lambda: c.vms.delete("v1"),
                     lambda: c.pool.unlink_cloud("aws"), lambda: c.pool.remove_prewarm("p")):
            err = _error(call)
            assert (err.status, err.code) == (200, "invalid_answer"), err


def test_remove_prewarm_reads_only_the_apis_404_as_no_such_prewarm(stand_in):
    stand_in.answer = (404, {"Content-Type": "text/html"}, b"<html>404 Not Found</html>")
    with fuse.Client(stand_in.url) as c:
        err = _error(c.pool.remove_prewarm, "p")  # was False: "no such prewarm", the prewarm running on
        assert (err.status, err.code) == (404, "invalid_answer")
        stand_in.answer = (404, {"Content-Type": "application/json"},
                           b'{"error": {"code": "not_found", "message": "no prewarm p"}}')
        assert c.pool.remove_prewarm("p") is False


def test_an_answer_that_does_not_decode_is_an_api_error_sync_and_async(stand_in):
    stand_in.answer = (200, {"Content-Type": "application/json", "Content-Encoding": "gzip"}, b"not gzip at all")
    with fuse.Client(stand_in.url) as c:
        err = _error(c.hosts.list)
    assert (err.status, err.code) == (0, "invalid_answer") and "does not decode" in err.message

    async def run():
        async with fuse.AsyncClient(stand_in.url) as ac:
            with pytest.raises(fuse.ApiError) as info:
                await ac.hosts.list()
            return info.value
    err = asyncio.run(run())
    assert err.code == "invalid_answer"


def test_health_waits_no_longer_than_the_clients_timeout(stand_in):
    stand_in.delay = 6.0
    with fuse.Client(stand_in.url, timeout=1) as c:
        t0 = time.monotonic()
        err = _error(c.health)
        took = time.monotonic() - t0
    assert err.code == "unreachable" and took < 4, took  # was 10 s whatever the timeout


@pytest.mark.parametrize("url", ["http://user:pw@127.0.0.1:8080", "http://127.0.0.1:8080?x=1",
                                 "http://127.0.0.1:8080/#frag", "http://127.0.0.1:8080?"])
def test_urls_a_controller_cannot_have_are_refused_where_the_client_is_made(url):
    with pytest.raises(ValueError) as info:
        fuse.Client(url)
    assert "pw" not in str(info.value)  # (the password is not repeated)


def test_a_lone_surrogate_in_a_name_is_a_value_error_not_an_encoder_traceback(stand_in):
    with fuse.Client(stand_in.url) as c:
        with pytest.raises(ValueError, match="lone surrogate"):
            c.vms.get("\udfff")
        with pytest.raises(ValueError, match="host .* lone surrogate"):
            c.vms.delete("x", host="\udfff")


def test_a_route_the_server_lacks_is_no_route_and_the_sdk_says_invalid_answer(tmp_path):
    """An agent's url given as the controller's, and a controller's url with a path: the
    route is not there, which is not "host h1 not found" (``is_not_found`` was True for a
    host and a VM that exist)."""
    import httpx
    agent = start_agent(tmp_path, backend="fake")
    ctl = start_controller(tmp_path, listen=True, token="ctl-token")
    tcp = f"http://127.0.0.1:{ctl.extra['port']}"
    try:
        r = httpx.get(tcp + "/v1/nope", headers={"Authorization": "Bearer ctl-token"}, timeout=10)
        assert (r.status_code, r.json()["error"]["code"]) == (404, "no_route"), r.text
        assert "GET /v1/nope" in r.json()["error"]["message"]
        with fuse.Client(tcp, token="ctl-token") as c:
            c.hosts.register(fuse.RegisterHostRequest(id="h1", url=agent.url, token=agent.token, backend="qemu",
                                                      capacity=fuse.HostCapacity(vm_count=2)))
            assert _error(c.hosts.get, "nope").code == "not_found"  # (a host missing is still not_found)
        for url, token in ((agent.url, agent.token), (tcp + "/api", "ctl-token")):
            with fuse.Client(url, token=token) as c:
                for call in (c.hosts.list, lambda: c.hosts.get("h1"), lambda: c.vms.delete("v1")):
                    err = _error(call)
                    assert (err.status, err.code) == (404, "invalid_answer") and not fuse.is_not_found(err), err
                    assert "no route" in err.message
    finally:
        ctl.stop()
        agent.stop()
