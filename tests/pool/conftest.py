"""Fixtures the pool tests share."""

from __future__ import annotations

import pytest

from support import free_port


@pytest.fixture(scope="module")
def moto_url():
    """A moto EC2 server on loopback for the module's tests (the aws provider's endpoint_url)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=(port := free_port()), verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()
