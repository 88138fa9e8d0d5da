"""client.controller on both clients against a real controller: GET/PUT
/v1/controller (seed 004's controller settings) were the one resource no SDK
method reached (review 17)."""

from __future__ import annotations

import pytest

import fuse
from support import reap, start_controller


@pytest.fixture
def ctl(tmp_path):
    c = start_controller(tmp_path)
    yield c
    c.stop()
    reap(tmp_path)


def test_the_sync_client_reads_and_replaces_the_settings(ctl, tmp_path):
    with fuse.Client(ctl.url) as c:
        assert c.controller.get() == {"cert": None, "ca": None, "placement": "best_fit", "key_set": False}
        with pytest.raises(fuse.ApiError) as err:
            c.controller.configure(cert=str(tmp_path / "none.pem"))
        assert (err.value.status, err.value.code) == (400, "invalid_argument")
        assert "give all three or none" in err.value.message
        with pytest.raises(fuse.ApiError) as err:
            c.controller.configure(cert=str(tmp_path / "c.pem"), key=str(tmp_path / "k.pem"), ca=str(tmp_path / "ca.pem"))
        assert err.value.status == 400 and "no file at" in err.value.message
        assert c.controller.configure() == {"cert": None, "ca": None, "placement": "best_fit", "key_set": False}


async def test_the_async_client_reads_the_settings(ctl):
    async with fuse.AsyncClient(ctl.url) as c:
        assert (await c.controller.get())["placement"] == "best_fit"
        assert (await c.controller.configure())["key_set"] is False


def test_the_cli_reads_and_replaces_the_settings(ctl, tmp_path):
    """`fuse controller settings`: the one resource the CLI had no command for (a mutual-TLS
    host could not be added from the CLI alone)."""
    import json
    import subprocess

    from fuse.transport.tls import create_ca, issue_cert
    from support import FUSE

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(FUSE + ["controller", "--url", ctl.url, "settings", *args], capture_output=True,
                              text=True, timeout=60)

    got = cli("--json")
    assert got.returncode == 0 and json.loads(got.stdout) == {"ca": None, "cert": None, "key_set": False,
                                                              "placement": "best_fit"}, got
    create_ca(tmp_path / "ca")
    files = issue_cert(tmp_path / "ca", "controller", tmp_path / "id", client=True)
    got = cli("--cert", str(files.cert), "--key", str(files.key), "--ca", str(files.ca), "--json")
    assert got.returncode == 0, got
    assert json.loads(got.stdout) | {"key_set": True} == {"cert": str(files.cert), "ca": str(files.ca),
                                                          "key_set": True, "placement": "best_fit"}
    got = cli("--placement", "best_fit")  # (alone it would drop the identity: the key's path is never shown)
    assert got.returncode == 2 and "give --cert, --key and --ca with it" in got.stderr, got
    got = cli("--cert", str(tmp_path / "none.pem"), "--key", str(files.key), "--ca", str(files.ca))
    assert got.returncode == 1 and "invalid_argument" in got.stderr and "Traceback" not in got.stderr, got
    with fuse.Client(ctl.url) as c:
        assert c.controller.get()["cert"] == str(files.cert)  # (a refused PUT changed nothing)


def test_both_clients_ask_the_health_check(ctl):
    import asyncio

    with fuse.Client(ctl.url) as c:
        assert c.health() == {"status": "ok"}

    async def from_async():
        async with fuse.AsyncClient(ctl.url) as c:
            return await c.health()

    assert asyncio.run(from_async()) == {"status": "ok"}


def test_relative_paths_are_the_callers_and_the_api_refuses_them(ctl, tmp_path, monkeypatch):
    """Review 21: the SDK sent "ca.pem" as given; the controller read it from its own working
    directory (400, or another file), and PUT kept it relative, so a controller started
    elsewhere later lost its identity."""
    import httpx

    from fuse.transport.tls import create_ca, issue_cert

    create_ca(tmp_path / "ca")
    issue_cert(tmp_path / "ca", "controller", tmp_path / "id", client=True)
    monkeypatch.chdir(tmp_path)  # the README's form: files named from where the caller stands
    with fuse.Client(ctl.url) as c:
        got = c.controller.configure(cert="id/controller.pem", key="id/controller.key", ca="id/ca.pem")
    assert got["cert"] == str(tmp_path / "id" / "controller.pem") and got["ca"] == str(tmp_path / "id" / "ca.pem")
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(ctl.socket)), base_url="http://c", timeout=30) as api:
        r = api.put("/v1/controller", json={"cert": "id/controller.pem", "key": "id/controller.key", "ca": "id/ca.pem"})
        assert r.status_code == 400 and r.json()["error"] == {
            "code": "invalid_argument",
            "message": "cert: id/controller.pem is a relative path: give an absolute one (the controller reads it, "
                       "from wherever it runs)"}
        assert api.get("/v1/controller").json()["cert"] == str(tmp_path / "id" / "controller.pem")
