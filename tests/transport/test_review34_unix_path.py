"""A unix:// address whose path is a regular file or a directory (review 31's known item): a
connect to it is refused as to a socket no agent listens on, and the registration said
"connection refused: is the host agent running?". It says what the path is."""

from __future__ import annotations

import pytest

import fuse


@pytest.mark.parametrize("kind", ["a regular file", "a directory"])
def test_registering_a_unix_path_that_is_no_socket_says_what_it_is(client, tmp_path, kind):
    path = tmp_path / "agent.sock"
    if kind == "a directory":
        path.mkdir()
    else:
        path.write_text("not a socket\n")
    with pytest.raises(fuse.ApiError) as info:
        client.hosts.register(fuse.RegisterHostRequest(id="h1", url=f"unix://{path}", backend="qemu",
                                                       capacity=fuse.HostCapacity(vm_count=4)))
    assert info.value.status == 502 and info.value.code == "host_unreachable", info.value
    assert f"{path} is {kind}, not a socket" in info.value.message, info.value.message
    assert [h.id for h in client.hosts.list()] == []  # nothing half-registered
