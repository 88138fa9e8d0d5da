"""Review 18 of the CLI (black-box findings 2, 5, 6, 8): `move --json` exits 1 for a
failed move, as without --json; `events` ends quietly (exit 0) when its reader closes
the pipe; `host cert issue` refuses a --name that is neither an IP address nor a DNS
name; the MCP tool words a missing or unknown argument in one sentence.

Real processes throughout: a controller and fake-backend agents, `fuse mcp` over stdio."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from support import FUSE, reap, start_agent, start_controller
from test_fuse_commands import fuse_cli


@pytest.fixture
def env(tmp_path):
    """A controller whose moves fail once copied (and go home), two fake agents
    registered as h1 and h2, and VM job1 running on h1."""
    ctl = start_controller(tmp_path, env={"FUSE_TEST_FAIL_AT": "copied"})
    agents = [start_agent(tmp_path, backend="fake", name=f"a{i}") for i in (1, 2)]
    e = {"ctl": ctl, "agents": agents, "env": {**os.environ, "FUSE_URL": ctl.url}}
    for name, a in zip(("h1", "h2"), agents):
        fuse_cli(e, "controller", "hosts", "add", "--name", name, "--addr", a.url, "--agent-token", a.token)
    fuse_cli(e, "controller", "vms", "create", "--name", "job1", "--entry", "job", "--host", "h1")
    yield e
    ctl.stop()
    for a in agents:
        a.stop()
    reap(tmp_path)


def test_a_failed_move_exits_1_with_json_as_without(env):
    # under --json it printed the failed move and exited 0: a script could not tell it by $?
    r = fuse_cli(env, "controller", "move", "job1", "--to", "h2", "--json", ok=False)
    assert r.returncode == 1, r.stdout + r.stderr
    m = json.loads(r.stdout)
    assert (m["state"], m["to"]) == ("failed", "h2") and "test hook" in m["reason"]
    r = fuse_cli(env, "controller", "move", "job1", "--to", "h2", ok=False)
    assert r.returncode == 1 and "failed" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("follow", [["--no-follow"], ["--follow", "--wait-s", "1"]],
                         ids=["caught up", "following"])
@pytest.mark.parametrize("fmt", [[], ["--json"]], ids=["lines", "json lines"])
def test_events_end_quietly_when_the_reader_closes_the_pipe(env, follow, fmt):
    # `events | head -1` printed "error: io_error: [Errno 32] Broken pipe" and exited 1. The
    # pipe's reading end is closed before the command writes, so its first line finds it gone.
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run(FUSE + ["controller", "events", "--since", "0"] + follow + fmt, stdout=write,
                           stderr=subprocess.PIPE, text=True, timeout=60, env=env["env"])
    finally:
        os.close(write)
    assert (r.returncode, r.stderr) == (0, "")


@pytest.fixture
def ca(tmp_path):
    subprocess.run(FUSE + ["host", "ca", "create", "--out", str(tmp_path / "ca")], check=True, capture_output=True,
                   timeout=60)
    return tmp_path / "ca"


@pytest.mark.parametrize("name", ["bad name!", "a..b", "-rack.example", "rack_1.example", "x" * 64 + ".example",
                                  ".".join(["a" * 63] * 3 + ["a" * 62]), "*.example.com", "256.1.1.1", "rack1."],
                         ids=["a space and a bang", "an empty label", "a leading hyphen", "an underscore",
                              "a 64-character label", "254 characters", "a wildcard", "a mistyped IPv4 address",
                              "a trailing dot"])
def test_cert_issue_refuses_a_name_no_address_can_match(ca, tmp_path, name):
    # it issued "bad name!.pem", a certificate no address could ever verify against
    out = tmp_path / "out"
    r = subprocess.run(FUSE + ["host", "cert", "issue", "--ca", str(ca), "--name", name, "--out", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == (f"error: invalid_argument: --name: {name!r} is neither an IP address nor a DNS name "
                        "(labels of 1-63 letters, digits and inner hyphens, joined by dots; 253 characters at most)\n")
    assert not out.exists()


@pytest.mark.parametrize("name, client", [("10.1.2.3", False), ("fd00::7", False), ("rack-1.Example.com", False),
                                          ("controller", True)],
                         ids=["an IPv4 address", "an IPv6 address", "a DNS name", "the controller's name"])
def test_cert_issue_takes_an_ip_address_or_a_dns_name(ca, tmp_path, name, client):
    out = tmp_path / "out"
    r = subprocess.run(FUSE + ["host", "cert", "issue", "--ca", str(ca), "--name", name, "--out", str(out), "--json"]
                       + (["--client"] if client else []), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (out / f"{name}.pem").exists() and name in json.loads(r.stdout)["names"]


def test_the_mcp_tool_words_a_missing_or_unknown_argument_in_one_sentence(tmp_path):
    # a call without path answered pydantic's several lines and a link; an unknown
    # argument was dropped without a word (a misspelt "bdy" would send no body)
    ctl = start_controller(tmp_path)
    params = StdioServerParameters(command=sys.executable, args=["-m", "fuse.cli", "mcp"],
                                   env={k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}
                                   | {"FUSE_URL": ctl.url})
    calls = [{"method": "GET"}, {"path": "/v1/hosts"}, {},
             {"method": "GET", "path": "/v1/hosts", "extra": 1},
             {"method": "POST", "path": "/v1/vms", "bdy": {"entry": "x"}}]

    async def run():
        with anyio.fail_after(90):
            async with stdio_client(params) as (read, write):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    said = [await s.call_tool("fuse_controller", args) for args in calls]
                    good = await s.call_tool("fuse_controller", {"method": "GET", "path": "/v1/hosts"})
                    return said, good

    try:
        said, good = anyio.run(run)
    finally:
        ctl.stop()
    assert all(r.is_error for r in said)
    texts = [r.content[0].text.removeprefix("Error executing tool fuse_controller: ") for r in said]
    assert texts == ["path is required (e.g. /v1/vms)", "method is required (e.g. GET)",
                     "method is required (e.g. GET)",
                     "unknown argument 'extra': the tool takes method, path, body",
                     "unknown argument 'bdy': the tool takes method, path, body"]
    assert not good.is_error and json.loads(good.content[0].text)["status"] == 200


@pytest.mark.parametrize("follow", [["--no-follow"], ["--follow"]])
def test_a_negative_wait_is_refused_as_the_api_refuses_it(follow):
    # (not following, --wait-s is never sent: it exited 0 where GET /v1/events?wait_s=-1 is 400)
    r = subprocess.run(FUSE + ["controller", "--url", "unix:///nonexistent.sock", "events", "--wait-s", "-1"] + follow,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--wait-s" in r.stderr and "0 or more" in r.stderr, r


@pytest.mark.parametrize("into_ca", [False, True], ids=["a directory of its own", "the CA's directory, --force"])
@pytest.mark.parametrize("name", ["ca", "CA"])  # (CA.pem is ca.pem where a file system ignores case: macOS's)
def test_cert_issue_refuses_the_name_ca_whose_files_are_the_cas_own(ca, tmp_path, into_ca, name):
    """Found by a black-box review of issue 7: `--name ca` wrote ca.pem and then the copy of
    the CA over it (exit 0, a key matching no certificate); into the CA's own directory with
    --force it replaced the CA with a leaf, and every later certificate came from that."""
    out = ca if into_ca else tmp_path / "out"
    before = {p.name: p.read_bytes() for p in ca.iterdir()}
    r = subprocess.run(FUSE + ["host", "cert", "issue", "--ca", str(ca), "--name", name, "--out", str(out)]
                       + (["--force"] if into_ca else []), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == (f"error: invalid_argument: --name '{name}': its files would be the CA's own (ca.pem, ca.key); "
                        "name the host by its address or DNS name\n")
    assert {p.name: p.read_bytes() for p in ca.iterdir()} == before  # the CA untouched
    assert into_ca or not out.exists()
