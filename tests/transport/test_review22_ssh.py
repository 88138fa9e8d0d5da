"""The SSH transport against an sshd whose MaxSessions is below the transport's own
channel limit (8): a session sshd refuses on a live connection is waited for, as when
every channel is busy, not taken for a dead connection (whose loss ended the requests
its other sessions were serving: 7 of 12 concurrent reads failed at MaxSessions 5)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from fuse.transport import ssh

from .conftest import FUSE, second_sshd
from .test_ssh import echo_socket  # noqa: F401 (the fixture: a stand-in agent on a unix socket)


@pytest.fixture
def few_sessions_sshd(sshd, processes, tmp_path):
    """A second sshd with the suite's keys that allows 3 sessions a connection."""
    proc, port, known = second_sshd(sshd, processes, tmp_path, max_sessions=3)
    yield port, known, proc
    proc.stop()


async def test_more_requests_at_once_than_sshd_allows_sessions_wait_their_turn(
        sshd, few_sessions_sshd, echo_socket, monkeypatch):  # noqa: F811
    port, known, proc = few_sessions_sshd
    for k, v in {**sshd.env(f"{FUSE} host relay --socket {echo_socket}"), "FUSE_SSH_KNOWN_HOSTS": str(known)}.items():
        monkeypatch.setenv(k, v)
    addr = f"ssh://root@127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(transport=ssh.SshTransport(addr), base_url="http://agent", timeout=60) as c:
            rs = await asyncio.gather(*[c.get("/slow", params={"s": "0.5"}) for _ in range(12)],
                                      return_exceptions=True)
            failed = [r if isinstance(r, Exception) else r.status_code for r in rs
                      if isinstance(r, Exception) or r.status_code != 200]
            assert failed == [], failed
            shared = ssh._shared_for(ssh.SshTarget.parse(addr))
            assert shared.most == 3 and shared.open <= 3
        # one connection served them all (no reconnect after a refused session)
        assert proc.text().count("Accepted publickey") == 1, proc.text()[-2000:]
    finally:
        await ssh.close_all()


class _Ended:
    """What asyncssh leaves of a relay process: its exit status (None: none came) and stderr."""

    def __init__(self, status):
        self.exit_status = status
        self.stderr = asyncio.StreamReader()
        self.stderr.feed_eof()

    async def wait_closed(self):
        return None


@pytest.mark.parametrize("status,said", [
    (None, "the SSH connection to 127.0.0.1:22 was dropped before the host answered"),
    (0, "the connection to the host agent through 127.0.0.1:22 was dropped before the host answered "
        "(its relay ended, exit 0)")])
async def test_a_request_cut_over_ssh_is_worded_as_over_the_other_transports(status, said):
    # (was: "the relay on 127.0.0.1:22 ended without answering (exit status None)")
    target = ssh.SshTarget.parse("ssh://root@127.0.0.1:22")
    assert await ssh._Channel(_Ended(status)).reason(target, "fuse host relay") == said
