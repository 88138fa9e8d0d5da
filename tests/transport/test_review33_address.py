"""The diff review of session 33: the address check grew (host-name labels, IDNA) and every poll
of every host asked it of the stored url (~15-30 µs a parse); ``transport_kind`` is cached. A
cached answer must stay the parse's: a bad address is refused every time, never cached as one."""

from __future__ import annotations

import pytest

from fuse.transport.address import BadAddress, transport_kind


def test_transport_kind_answers_as_the_parse_does_every_time():
    for _ in range(3):
        assert transport_kind("http://10.0.0.5:8090") == "http"
        assert transport_kind("ssh://ops@host-17.example.com") == "ssh"
        assert transport_kind("host-17.example.com:8443") == "tls"
        with pytest.raises(BadAddress):
            transport_kind("http://a..b:8090")
    assert transport_kind.cache_info().hits >= 6
