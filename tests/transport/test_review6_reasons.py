"""Reasons are sentences, never an exception's class name: a mutual-TLS host
that accepts the connection but never shakes hands says which step ran out of
time and how long it had, and an SSH relay that fails reports its failure, not
the notice sshd wrote first (a login account's missing home directory)."""

from __future__ import annotations

import socket

import httpx
import pytest

from fuse.transport import HostConnection, TlsSettings, _describe, parse_address, ssh
from support import unreachable

NOTICE = "Could not chdir to home directory /nonexistent: No such file or directory"


# ------------------------------------------------------------------ mutual TLS

async def test_a_tls_listener_that_never_shakes_hands_says_so_with_the_real_timeout(pki):
    silent = socket.socket()  # the kernel accepts the TCP connection; nobody ever replies
    try:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        addr = f"127.0.0.1:{silent.getsockname()[1]}"
        err, took = await unreachable(HostConnection(addr, tls=TlsSettings(*pki.files(pki.controller, "controller")),
                                                     timeout=1.0))
    finally:
        silent.close()
    assert took < 5
    assert err.message == f"{addr} did not complete the TLS handshake within 1 s", err.message
    assert err.http_status == 502 and err.maybe_sent is False


async def test_an_https_listener_that_never_shakes_hands_says_so_not_that_it_refused_the_connection():
    """Found by a black-box review of issue 7: an https:// address whose listener accepted the
    TCP connection and then said nothing read "did not accept the connection within 1 s"
    (only a mutual-TLS address was told the handshake was what timed out)."""
    silent = socket.socket()
    try:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        addr = f"https://127.0.0.1:{silent.getsockname()[1]}"
        err, took = await unreachable(HostConnection(addr, "tok", timeout=1.0))
    finally:
        silent.close()
    assert took < 5
    assert err.message == f"{addr} did not complete the TLS handshake within 1 s", err.message


async def test_a_tls_address_that_hangs_up_at_once_is_not_a_certificate_refused(pki):
    """A port that accepts and closes at once (a port forward with nothing behind it) read
    as the host refusing the controller's certificate: an operator reissued certificates."""
    addr, close = _loopback_server(None)
    try:
        err, _ = await unreachable(HostConnection(addr, tls=TlsSettings(*pki.files(pki.controller, "controller")),
                                                  timeout=5.0))
    finally:
        close()
    assert err.message == (f"the connection to {addr} was closed during the TLS handshake, before the host "
                           "answered it: nothing speaking TLS seems to be behind the address"), err.message
    assert err.code == "host_unreachable"


def _fail(kind: type[Exception]) -> Exception:
    exc = kind("")
    exc.request = httpx.Request("GET", "https://127.0.0.1:9/v1/host",
                                extensions={"timeout": {"connect": 3.0, "read": 7.0, "write": 4.0, "pool": 2.0}})
    return exc


@pytest.mark.parametrize("kind, handshake, expected", [
    (httpx.ConnectTimeout, "cut", "127.0.0.1:9 did not complete the TLS handshake within 3 s"),
    (httpx.ConnectTimeout, "", "127.0.0.1:9 did not accept the connection within 3 s"),
    (httpx.ReadTimeout, "done", "127.0.0.1:9 did not answer in time: nothing came back within 7 s"),
    (httpx.WriteTimeout, "", "127.0.0.1:9 did not take the request within 4 s"),
    (httpx.PoolTimeout, "", "no connection to 127.0.0.1:9 came free within 2 s"),
    (httpx.ConnectError, "", "cannot reach 127.0.0.1:9: the connection could not be opened"),
    (httpx.ReadError, "", "cannot reach 127.0.0.1:9: the connection broke while waiting for the answer"),
    (httpx.WriteError, "", "cannot reach 127.0.0.1:9: the connection broke while sending the request"),
    (httpx.RemoteProtocolError, "", "127.0.0.1:9 answered with something that is not HTTP"),
], ids=["a handshake that timed out names the handshake and its time",
        "a TCP connect that timed out names the connection and its time",
        "an answer that never came names the read time",
        "a request the host would not take names the write time",
        "no free connection names the pool time",
        "a connect error with no text says the connection could not be opened",
        "a read error with no text says the connection broke while waiting",
        "a write error with no text says the connection broke while sending",
        "a protocol error with no text says the answer was not HTTP"])
def test_every_silent_exception_on_a_tls_address_becomes_a_sentence(kind, handshake, expected):
    why, untrusted = _describe(_fail(kind), parse_address("127.0.0.1:9"), handshake=handshake)
    assert why == expected and not untrusted
    assert kind.__name__ not in why


# ------------------------------------------------------------------ the SSH relay

@pytest.fixture
async def ssh_env(sshd, monkeypatch):
    for k, v in sshd.env("unused").items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("FUSE_SSH_CONNECT_TIMEOUT", "5")
    yield sshd
    await ssh.close_all()


async def relay_reason(addr: str) -> tuple[str, float]:
    err, took = await unreachable(HostConnection(addr, timeout=10))
    return err.message, took


async def test_a_relay_that_fails_after_a_notice_reports_the_failure_not_the_notice(ssh_env, monkeypatch):
    # sshd's notice goes first, the relay's own failure after it, in a later packet
    monkeypatch.setenv("FUSE_SSH_RELAY", f"echo '{NOTICE}' >&2; sleep 0.3; echo 'relay: the agent said no' >&2; exit 3")
    msg, took = await relay_reason(ssh_env.addr)
    assert "Could not chdir" not in msg and "the agent said no" in msg, msg
    assert took < 10


async def test_a_relay_that_fails_silently_after_a_notice_reports_its_exit_status(ssh_env, monkeypatch):
    monkeypatch.setenv("FUSE_SSH_RELAY", f"echo '{NOTICE}' >&2; exit 3")
    msg, took = await relay_reason(ssh_env.addr)
    assert msg == (f"the relay command `echo '{NOTICE}' >&2; exit 3` on 127.0.0.1:{ssh_env.port} failed "
                   "(exit 3) without saying why"), msg
    assert took < 10



def test_a_mutual_tls_address_without_the_controllers_certificate_says_nothing_was_sent():
    # a create reads maybe_sent to know whether the host may still create the VM: this
    # refusal sends nothing, so the create may try another host (it held the host 600 s)
    from fuse.transport import NotTrusted

    with pytest.raises(NotTrusted) as info:
        HostConnection("127.0.0.1:9", token="t", tls=None)
    assert info.value.maybe_sent is False and "no certificate" in info.value.message


def _loopback_server(reply: bytes | None):
    """A TCP server on loopback that answers each connection with ``reply`` once a
    request arrives (None: closes it at once); (address, close)."""
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            if reply is not None:
                conn.recv(65536)
                conn.sendall(reply)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{srv.getsockname()[1]}", srv.close


async def test_reasons_never_quote_what_the_peer_sent_or_the_librarys_codes():
    addr, close = _loopback_server(b"garbage garbage\r\n\r\n")
    try:
        err, _ = await unreachable(HostConnection(f"http://{addr}", timeout=5.0))
    finally:
        close()
    assert err.message == f"http://{addr} answered with something that is not HTTP", err.message
    addr, close = _loopback_server(None)
    try:
        err, _ = await unreachable(HostConnection(f"https://{addr}", timeout=5.0))
    finally:
        close()
    # (the close reaches the client as an end of file or, when its hello came after it, a reset)
    assert err.message in (f"the connection to https://{addr} was closed during the TLS handshake, before the "
                           "host answered it",
                           f"the connection to https://{addr} was dropped before the host answered "
                           "(connection reset by peer)"), err.message
    assert "_ssl.c" not in err.message and "[SSL" not in err.message and "Errno" not in err.message


def test_a_name_that_does_not_resolve_says_so_without_the_errno():
    exc = httpx.ConnectError("[Errno -2] Name or service not known")
    exc.__cause__ = socket.gaierror(-2, "Name or service not known")
    why, untrusted = _describe(exc, parse_address("http://nohost.invalid:8090"))
    assert why == "cannot resolve the host name in http://nohost.invalid:8090: name or service not known", why
    assert not untrusted
