"""A controller's ``unix://`` url, in the SDK and the CLI, read by the rules of a host's address
(review 35): the scheme in any case and trailing slashes dropped, and no socket path
(``unix:///``), a relative one or a query or fragment refused as a ``ValueError`` where the
client is made (the CLI: one ``invalid_argument`` line, exit 2). It was taken as written:
``unix:///run/c.sock/`` and ``unix:///`` were dialled and read as "controller unreachable",
``UNIX://`` was no url, and ``unix://c.sock`` dialled whatever the working directory held."""

from __future__ import annotations

import asyncio

import pytest
from typer.testing import CliRunner

import fuse
from fuse.cli.main import app


def spellings(sock) -> list[str]:
    """Other spellings of the url ``unix://{sock}``, each of which reaches the same controller."""
    return [f"unix://{sock}/", f"unix://{sock}//", f"UNIX://{sock}", f"Unix://{sock}/"]


def refused(sock) -> list[tuple[str, str]]:
    """(url, what the ValueError says) for urls that name no controller socket."""
    return [("unix:///", "names no socket path"), ("unix:////", "names no socket path"),
            ("unix://", "names no socket path"), (f"unix://{sock}?x=1", "has a query or fragment"),
            (f"unix://{sock}#top", "has a query or fragment"), (f"unix://{sock.name}", "is relative"),
            (f"UNIX://{sock.name}/", "is relative")]


def test_every_spelling_of_the_socket_reaches_the_controller_sync_and_async(controller):
    for url in spellings(controller.socket):
        with fuse.Client(url) as c:
            assert c.health() == {"status": "ok"} and c.hosts.list() == [], url

    async def main():
        for url in spellings(controller.socket):
            async with fuse.AsyncClient(url) as c:
                assert await c.health() == {"status": "ok"} and await c.hosts.list() == [], url
    asyncio.run(main())


def test_an_unreachable_socket_is_named_as_the_controller_stores_it(tmp_path):
    # (the trailing slash dropped: "Not a directory" was the slash, not the controller)
    with fuse.Client(f"UNIX://{tmp_path}/none.sock/") as c:
        with pytest.raises(fuse.ApiError) as err:
            c.hosts.list()
    assert err.value.code == "unreachable" and f"unix://{tmp_path}/none.sock:" in err.value.message
    assert "Not a directory" not in err.value.message


def test_a_url_that_names_no_controller_socket_is_a_value_error_where_the_client_is_made(controller, monkeypatch):
    # (the relative one would dial the socket in the working directory: the controller's, here)
    monkeypatch.chdir(controller.socket.parent)
    for url, says in refused(controller.socket):
        for make in (fuse.Client, fuse.AsyncClient):
            with pytest.raises(ValueError, match=says):
                make(url)
    with pytest.raises(ValueError, match=r"unix:///path/to/controller\.sock"):  # (not an agent's example)
        fuse.Client("unix:///")


@pytest.mark.parametrize("group", [["controller", "hosts", "list"], ["pool", "budget"]], ids=["controller", "pool"])
def test_the_cli_refuses_them_as_a_bad_flag_and_takes_the_other_spellings(controller, monkeypatch, group):
    monkeypatch.chdir(controller.socket.parent)
    for url, says in refused(controller.socket):
        r = CliRunner().invoke(app, group, env={"FUSE_URL": url, "FUSE_TOKEN": ""})
        assert r.exit_code == 2, f"{url}: exit {r.exit_code}: {r.stdout}{r.stderr}{r.exception!r}"
        assert r.exception is None or isinstance(r.exception, SystemExit), r.exception  # no traceback
        assert says in r.stderr and "invalid_argument" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = CliRunner().invoke(app, ["controller", "--url", f"UNIX://{controller.socket}/", "hosts", "list", "--json"],
                           env={"FUSE_TOKEN": ""})
    assert r.exit_code == 0 and r.stdout.strip() == "[]", f"exit {r.exit_code}: {r.stdout}{r.stderr}"
