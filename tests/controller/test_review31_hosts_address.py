"""Host addresses, from review 31 (finding 5): an address is stored in one spelling, the
scheme and host name in lower case and the port without leading zeros, in every form the
parser takes; so the same address spelt another way is not a move (it was 409 while the
agent did not answer and had a VM)."""

from __future__ import annotations

import signal

import pytest

import fuse
from fuse import HostCapacity
from fuse.transport import normalise_address
from support import start_agent, start_controller


@pytest.mark.parametrize("given, stored", [
    ("http://LOCALHOST:21434", "http://localhost:21434"),
    ("HTTP://LocalHost:21499/", "http://localhost:21499"),
    ("https://127.0.0.1:021406", "https://127.0.0.1:21406"),
    ("127.0.0.1:021406", "127.0.0.1:21406"),
    ("Agent-1.Example.COM:8443", "agent-1.example.com:8443"),
    ("[::1]:0443", "[::1]:443"),
    ("https://[FE80::1]:443/", "https://[fe80::1]:443"),
    ("SSH://Admin@Box.Example:022/", "ssh://Admin@box.example:22"),
    ("http://Host:8090/Prefix/", "http://host:8090/Prefix"),
    ("UNIX:///run/Fuse.sock", "unix:///run/Fuse.sock"),
    ("local", "local"),
], ids=["an http host name in capitals", "an http scheme and host name in capitals, a trailing slash",
        "an https port with a leading zero", "a mutual-TLS port with a leading zero",
        "a mutual-TLS host name in capitals", "a mutual-TLS IPv6 address with a leading zero in its port",
        "an IPv6 literal in capitals", "an ssh address keeps its user's case",
        "an http path prefix keeps its case", "a socket path keeps its case", "the local socket"])
def test_one_spelling_for_each_address(given, stored):
    # (was: stored as given, but for the http(s) and ssh scheme's case and their ports)
    assert normalise_address(given) == stored
    assert normalise_address(stored) == stored


def test_the_same_address_in_capitals_is_not_a_move_while_the_agent_does_not_answer(tmp_path):
    agent = start_agent(tmp_path, backend="fake", name="a1")
    ctl = start_controller(tmp_path)
    client = fuse.Client(ctl.url)
    port = agent.url.rsplit(":", 1)[1]
    cap = HostCapacity(vm_count=2, cpus=2, ram_mb=4096, storage_gb=10)

    def register(url: str):
        return client.hosts.register(fuse.RegisterHostRequest(id="hc", url=url, token=agent.token, backend="qemu",
                                                              capacity=cap))
    try:
        register(f"http://localhost:{port}")
        client.vms.create({"name": "k", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "sleep 1000",
                           "host": "hc"})
        agent.popen.send_signal(signal.SIGSTOP)
        try:
            # (was: 409 conflict "host hc still has vm k assigned; it cannot move to http://LOCALHOST:...")
            host = register(f"HTTP://LOCALHOST:0{port}/")
            assert host.url == f"http://localhost:{port}"
            assert [w for w in host.warnings if w.startswith("probe skipped")], host.warnings
        finally:
            agent.popen.send_signal(signal.SIGCONT)
        assert client.hosts.get("hc").url == f"http://localhost:{port}"
        assert [v["name"] for v in client.vms.list()] == ["k"]
    finally:
        client.close()
        ctl.stop()
        agent.stop()
