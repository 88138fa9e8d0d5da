"""Which host addresses are this machine's own agent (a prewarm placement's ``machine`` is
``local`` for them): a unix socket, or any transport to a loopback host."""

from __future__ import annotations

import pytest

from fuse.transport import on_this_machine


@pytest.mark.parametrize("addr, here", [
    ("local", True),
    ("unix:///run/fuse/agent.sock", True),
    ("http://127.0.0.1:7070", True),
    ("https://127.0.0.2:7070/agent", True),
    ("http://localhost:7070", True),
    ("http://[::1]:7070", True),
    ("127.0.0.1:7443", True),
    ("ssh://fuse@localhost", True),
    ("http://10.0.0.5:7070", False),
    ("http://rack2.example:7070", False),
    ("rack2:7443", False),
    ("ssh://fuse@[2001:db8::1]:22", False),
    ("http://999.1.1.1:80", False),
    ("", False),
], ids=["the agent's default socket", "a unix socket", "http on 127.0.0.1", "https on 127.0.0.0/8",
        "localhost", "IPv6 loopback", "mutual TLS on loopback", "ssh to localhost", "a private address",
        "a host name (it may resolve anywhere)", "mutual TLS to a name", "ssh to another IPv6 host",
        "not an address", "nothing"])
def test_an_agent_is_on_this_machine_on_a_unix_socket_or_loopback(addr, here):
    assert on_this_machine(addr) is here
