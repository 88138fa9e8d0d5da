"""Review 38 (the environments operators bring), findings 1, 4 and 5: a server's state dir
others may write to (or another user owns) is refused at start as a ``--socket``'s directory
is, and the dirs fuse makes stay 0700 whatever the umask; a table (or an events line) on a
stdout whose encoding cannot hold a host id or an entry shows ``?`` for what it cannot, not
a traceback; the times the CLI shows carry their date and UTC offset; the controller's
banner with no socket has one space after its colon.

Real processes: `fuse host serve` (fake backend) and `fuse controller serve` as the
operator runs them, and the CLI against them."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import pytest

from support import FUSE, fake_bundle, reap, start_agent, start_controller, wait_until


def server_args(what: str, tmp: Path, state: Path) -> list[str]:
    if what == "agent":
        return ["host", "serve", "--backend", "fake", "--state-dir", str(state), "--socket", str(tmp / "a.sock")]
    return ["controller", "serve", "--state-dir", str(state), "--socket", str(tmp / "c.sock")]


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ---- finding 1: a state dir others may write to -------------------------------------------------

@pytest.mark.parametrize("what", ["agent", "controller"])
@pytest.mark.parametrize("dir_mode", [0o777, 0o770], ids=["anyone may write", "the group may write"])
def test_a_state_dir_others_may_write_to_is_refused_at_start_as_a_sockets_dir_is(tmp_path, what, dir_mode):
    state = tmp_path / "state"
    fake_bundle(state)  # (what an agent's dir holds: it is refused all the same)
    os.chmod(state, dir_mode)
    r = subprocess.run(FUSE + server_args(what, tmp_path, state), capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"error: io_error: the state dir {state} is writable by others "
                               f"(mode {dir_mode:o}), who could put their own files where the "), r.stderr
    assert f"chmod go-w {state}" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stdout == "" and not (state / "lock").exists() and mode(state) == dir_mode  # (refused before anything)
    assert not (tmp_path / ("a.sock" if what == "agent" else "c.sock")).exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a dir to another user needs root")
@pytest.mark.parametrize("what", ["agent", "controller"])
def test_a_state_dir_another_user_owns_is_refused_at_start(tmp_path, what):
    state = tmp_path / "state"
    fake_bundle(state)
    os.chmod(state, 0o700)
    os.chown(state, 65534, 65534)  # (nobody's: as root the server could use it, and they could swap its files)
    r = subprocess.run(FUSE + server_args(what, tmp_path, state), capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"error: io_error: the state dir {state} belongs to another user (uid 65534)"), r.stderr
    assert not (state / "lock").exists()


def _serve(what: str, tmp_path, state, **popen) -> subprocess.Popen:
    """``fuse host serve`` / ``fuse controller serve`` on ``state``, once it answers on its socket
    (the caller terminates it)."""
    log = open(tmp_path / "server.log", "wb")
    p = subprocess.Popen(FUSE + server_args(what, tmp_path, state), stdout=log, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True, **popen)
    log.close()
    sock = tmp_path / ("a.sock" if what == "agent" else "c.sock")
    path = "/v1/host" if what == "agent" else "/v1/healthz"
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://x") as c:
            wait_until(lambda: p.poll() is not None or (sock.exists() and c.get(path, timeout=5).status_code == 200),
                       timeout=120, what=f"{what} on {state}")
        assert p.poll() is None, (tmp_path / "server.log").read_text()
    except BaseException:
        p.terminate()
        p.wait(timeout=60)
        raise
    return p


@pytest.mark.parametrize("what", ["agent", "controller"])
@pytest.mark.parametrize("dir_mode", [0o700, 0o1777], ids=["its own", "sticky, as a tmpfs mounts"])
def test_a_server_starts_on_a_state_dir_of_its_own_or_a_sticky_one(tmp_path, what, dir_mode):
    """A tmpfs mounted as it comes is 1777: others may add entries there but not rename or
    remove the server's (the sticky bit), so it is served (a full-disk rig is such a mount)."""
    state = tmp_path / "state"
    fake_bundle(state)
    os.chmod(state, dir_mode)
    p = _serve(what, tmp_path, state)
    try:
        assert (state / "lock").exists() and mode(state) == dir_mode
    finally:
        p.terminate()
        p.wait(timeout=60)


@pytest.mark.parametrize("what", ["agent", "controller"])
def test_a_state_dir_the_server_makes_under_umask_000_is_700_and_served(tmp_path, what):
    """The dirs fuse makes are 0700 whatever the umask, so the rule never refuses its own."""
    state = tmp_path / "made" / "here"
    p = _serve(what, tmp_path, state, umask=0)
    try:
        assert mode(state) == 0o700 and mode(state.parent) == 0o700
    finally:
        p.terminate()
        p.wait(timeout=60)


def test_host_probe_makes_a_missing_state_dir_700_whatever_the_umask(tmp_path):
    """`fuse host probe --state-dir` made it with the umask's mode (0777 under umask 000), a
    dir `fuse host serve` would then refuse."""
    state = tmp_path / "probed" / "state"
    r = subprocess.run(FUSE + ["host", "probe", "--backend", "fake", "--state-dir", str(state), "--json"],
                       capture_output=True, text=True, timeout=120, umask=0)
    assert r.returncode == 0, r.stderr
    assert mode(state) == 0o700 and mode(state.parent) == 0o700, (oct(mode(state)), oct(mode(state.parent)))


# ---- finding 4: a stdout that cannot encode the text ------------------------------------------------

HOST = "d-ü ☃"


@pytest.fixture
def fleet(tmp_path):
    """A controller with one fake agent registered as ``HOST`` (not ASCII, nor latin-1)."""
    ctl = start_controller(tmp_path)
    agent = start_agent(tmp_path, backend="fake", name="a1")
    env = {**os.environ, "FUSE_URL": ctl.url}
    r = subprocess.run(FUSE + ["controller", "hosts", "add", "--name", HOST, "--addr", agent.url, "--agent-token",
                               agent.token], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    yield env
    ctl.stop()
    agent.stop()
    reap(tmp_path)


@pytest.mark.parametrize("encoding,says", [("ascii", "d-? ?"), ("latin-1", "d-ü ?")])
def test_tables_and_events_on_a_stdout_that_cannot_encode_them_show_question_marks(fleet, encoding, says):
    env = {**fleet, "PYTHONIOENCODING": encoding}
    r = subprocess.run(FUSE + ["controller", "hosts", "list"], capture_output=True, timeout=120, env=env)
    out, err = r.stdout.decode(encoding), r.stderr.decode(errors="replace")
    assert r.returncode == 0 and "Traceback" not in err and "UnicodeEncodeError" not in err, err
    assert says in out, out
    # (an events line is click's: it takes an ASCII stdout for a misconfigured one and writes UTF-8)
    r = subprocess.run(FUSE + ["controller", "events", "--no-follow"], capture_output=True, timeout=120, env=env)
    out, err = r.stdout.decode("utf-8" if encoding == "ascii" else encoding), r.stderr.decode(errors="replace")
    assert r.returncode == 0 and "Traceback" not in err and "UnicodeEncodeError" not in err, err
    assert (HOST if encoding == "ascii" else says) in out, out


# ---- finding 5: times with their date and zone -----------------------------------------------------

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d\d:\d\d"


def shown(t: float, zone: str) -> str:
    """``t`` as the CLI should show it in ``zone``: ``2026-12-07 13:14:43 -05:00``."""
    at = datetime.fromtimestamp(t, ZoneInfo(zone))
    minutes = int(at.utcoffset().total_seconds() // 60)
    return f"{at:%Y-%m-%d %H:%M:%S} {'-' if minutes < 0 else '+'}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


@pytest.mark.parametrize("zone", ["America/New_York", "Pacific/Chatham"])
def test_events_show_the_local_date_and_time_with_the_utc_offset(fleet, zone):
    env = {**fleet, "TZ": zone, "PYTHONIOENCODING": "utf-8"}
    got = subprocess.run(FUSE + ["controller", "events", "--no-follow", "--json"], capture_output=True, text=True,
                         timeout=120, env=env)
    events = [json.loads(line) for line in got.stdout.splitlines()]
    assert events, got.stderr
    r = subprocess.run(FUSE + ["controller", "events", "--no-follow"], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == len(events), r.stdout
    for e, line in zip(events, lines):
        want = shown(e["time"], zone)
        assert re.match(rf"^\s*{e['id']} {STAMP} ", line) and f" {want} " in line, (want, line)


@pytest.fixture
def zone(monkeypatch):
    """This process's local zone set to ``America/New_York`` (``time.tzset``), and back after."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield "America/New_York"
    monkeypatch.undo()
    time.tzset()


def test_pool_tables_show_the_date_to_the_minute_with_the_utc_offset(zone, capsys):
    from fuse.cli.pool import _host_table, _prewarm_table
    from fuse.models.pool import ElasticHost, Prewarm

    winter, summer = 1796665283, 1783000000  # 2026-12-07 (-05:00), 2026-07-02 (-04:00: DST)
    _host_table([ElasticHost(name="dev-1", provider="c", type_name="t", region="r", state="running",
                             started=summer, expires=winter)])
    out = capsys.readouterr().out
    assert "2026-07-02 09:46 -04:00" in out and "2026-12-07 12:41 -05:00" in out, out
    later = int(time.time()) + 600
    _prewarm_table([Prewarm(id="pw-1", image="img", kind="vm", cpus=1, memory_mb=256, count=2, expires_at=winter,
                            backoff_until=later, backoff_reason="r")])
    out = capsys.readouterr().out
    assert "2026-12-07 12:41 -05:00" in out and shown(later, zone) in out, out


@pytest.mark.parametrize("what", ["agent", "controller"])
def test_the_banner_has_one_space_after_its_colon_whatever_is_served(tmp_path, what):
    """`controller serve --no-socket` said ``fuse controller:  listen ...``; an agent on a
    socket alone, ``fuse host agent:  socket ...``."""
    if what == "agent":
        fake_bundle(tmp_path / "state")
        args = ["host", "serve", "--backend", "fake", "--state-dir", str(tmp_path / "state"),
                "--socket", str(tmp_path / "a.sock")]
        want = f"fuse host agent: socket {tmp_path / 'a.sock'}"
    else:
        args = ["controller", "serve", "--state-dir", str(tmp_path / "state"), "--no-socket",
                "--listen", "127.0.0.1:0", "--token", "t0k"]
        want = "fuse controller: listen 127.0.0.1:"
    p = subprocess.Popen(FUSE + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        line = p.stdout.readline().rstrip("\n")
        assert line.startswith(want) and "  " not in line, line
    finally:
        p.terminate()
        p.wait(timeout=60)


def test_a_bundle_built_under_umask_002_makes_a_state_dir_the_agent_takes(tmp_path):
    """`fuse bundle build` (and `fuse up`'s first build) made the state dir and its `bundles` dir
    with `mkdir(parents=True)`: 0775 under umask 002, which the agent now refuses. They are made
    0755 whatever the umask."""
    import os

    from fuse.agent import bundle
    from fuse.paths import state_dir_access_problem

    state = tmp_path / "fuse-state" / "agent"
    old = os.umask(0o002)
    try:
        bundle._make_parents(state / "bundles")
    finally:
        os.umask(old)
    for d in (state.parent, state, state / "bundles"):
        assert d.stat().st_mode & 0o777 == 0o755, d
    assert state_dir_access_problem(state, "host agent") is None


@pytest.mark.skipif(os.geteuid() != 0, reason="giving an entry to another user needs root")
@pytest.mark.parametrize("what", ["agent", "controller"])
def test_a_sticky_state_dir_holding_another_users_entry_is_refused(tmp_path, what):
    """In a sticky dir open to all, another user may make `vms/` before the server's first start;
    the server would then keep its VMs in a directory that user owns (the diff review)."""
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o1777)
    (state / "vms").mkdir()
    os.chown(state / "vms", 65534, 65534)
    r = subprocess.run(FUSE + server_args(what, tmp_path, state), capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "holds vms, which belongs to another user (uid 65534)" in r.stderr, r.stderr
    assert not (state / "lock").exists()


def test_a_time_past_year_9999_is_shown_as_its_number():
    """`fuse controller events` exited 2 `invalid_argument` on an event whose time is past year
    9999 (a server's answer the SDK takes): the line shows the number as sent (the diff review)."""
    from fuse.cli.output import local_time

    assert local_time(1e12) == "1e+12"
    assert local_time(0).startswith(("1970-01-01", "1969-12-31"))
