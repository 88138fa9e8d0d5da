"""Answers that are not the API's (a proxy's page, a server that is no controller) raise
fuse.ApiError saying so, sync and async (was: a bare JSONDecodeError for a 200 that is not
JSON, and an HTML 404 page as the message with an empty code)."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import fuse


@pytest.fixture
def not_a_controller():
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            status, body, kind = ((200, b"hello, I am a web page", "text/plain") if self.path.startswith("/v1/hosts")
                                  else (404, b"<html><body><h1>404 Not Found</h1></body></html>", "text/html"))
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_200_that_is_not_json_is_an_api_error(not_a_controller):
    with fuse.Client(not_a_controller) as c:
        with pytest.raises(fuse.ApiError) as info:
            c.hosts.list()
    assert (info.value.status, info.value.code) == (200, "invalid_answer")
    assert "is the url a fuse controller?" in info.value.message


def test_an_error_page_is_an_api_error_with_a_code_and_no_html_wall(not_a_controller):
    with fuse.Client(not_a_controller) as c:
        with pytest.raises(fuse.ApiError) as info:
            c.vms.get("x")
    assert (info.value.status, info.value.code) == (404, "invalid_answer")
    assert not fuse.is_not_found(info.value)  # a page's 404 does not say the VM is gone
    assert "404 Not Found" in info.value.message and "\n" not in info.value.message


def test_the_async_client_says_the_same(not_a_controller):
    async def run():
        async with fuse.AsyncClient(not_a_controller) as c:
            with pytest.raises(fuse.ApiError) as info:
                await c.hosts.list()
            return info.value
    err = asyncio.run(run())
    assert (err.status, err.code) == (200, "invalid_answer")


@pytest.mark.parametrize("count", [True, "2", 2.0])
def test_a_mig_count_that_is_no_whole_number_is_refused_where_the_record_is_made(count):
    """(was: read as 1 or 2 by the SDK and sent, where the REST API refuses them)"""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="Input should be a valid integer"):
        fuse.HostCapacity(mig_profiles={"1g.10gb": count})
    assert fuse.HostCapacity(mig_profiles={"1g.10gb": 2}).mig_profiles == {"1g.10gb": 2}
