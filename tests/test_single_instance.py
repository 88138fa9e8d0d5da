"""One server per unix socket and per state dir: a second `fuse host serve` or
`fuse controller serve` on a socket a running one answers on, or on a state dir a
running one holds, exits 3 (as for a TCP port in use) with one line naming it, and
the first keeps serving. A socket file nothing listens on, or a dir whose holder
died (even by SIGKILL), is taken as before."""

from __future__ import annotations

import signal
import subprocess

import httpx

from support import FUSE, fake_bundle, start_agent, start_controller, wait_until

STARTUP_FAILURE = 3


def second(args: list[str], timeout: float = 30) -> tuple[int | None, str]:
    """Run a second server; its exit status and stderr, or (None, stderr) when it was
    still serving after ``timeout`` seconds (it is stopped then)."""
    p = subprocess.Popen(FUSE + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        _, err = p.communicate(timeout=timeout)
        return p.returncode, err
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        try:
            _, err = p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate(timeout=5)
        return None, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def agent_id_on(sock) -> str:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://x") as c:
        return c.get("/v1/host", timeout=5).json()["agent_id"]


def healthy(sock) -> bool:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://x") as c:
        return c.get("/v1/healthz", timeout=5).status_code == 200


def agent_args(state, sock) -> list[str]:
    fake_bundle(state)
    return ["host", "serve", "--backend", "fake", "--state-dir", str(state), "--socket", str(sock)]


def test_a_second_agent_on_a_running_agents_socket_exits_3_and_takes_it_once_that_one_died(tmp_path):
    sock = tmp_path / "agent.sock"
    first = start_agent(tmp_path, backend="fake", name="a", socket_path=sock)
    try:
        ident = agent_id_on(sock)
        rc, err = second(agent_args(tmp_path / "b", sock))
        assert rc == STARTUP_FAILURE, err
        line = one_line(err)
        assert f"socket {sock} is in use by a running" in line, line
        assert agent_id_on(sock) == ident and first.popen.poll() is None
    finally:
        first.kill()  # SIGKILL: its socket file stays, nothing listening on it
    assert sock.exists()
    p = subprocess.Popen(FUSE + agent_args(tmp_path / "b", sock), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_until(lambda: p.poll() is None and agent_id_on(sock) != ident, timeout=30,
                          what="the second agent on the stale socket")
    finally:
        p.terminate()
        p.wait(15)


def test_a_second_controller_on_a_running_controllers_socket_exits_3_and_the_first_keeps_it(tmp_path):
    first = start_controller(tmp_path, name="c1")
    try:
        rc, err = second(["controller", "serve", "--state-dir", str(tmp_path / "c2"), "--socket", str(first.socket)])
        assert rc == STARTUP_FAILURE, err
        assert f"socket {first.socket} is in use by a running" in one_line(err)
        assert healthy(first.socket) and first.popen.poll() is None
    finally:
        first.stop()


def test_a_second_agent_on_a_held_state_dir_exits_3_and_one_may_start_once_the_holder_died(tmp_path):
    first = start_agent(tmp_path, backend="fake", name="a")
    try:
        rc, err = second(agent_args(first.state_dir, tmp_path / "other.sock"))
        assert rc == STARTUP_FAILURE, err
        assert f"state dir {first.state_dir} is in use by a running host agent" in one_line(err)
    finally:
        first.kill()  # SIGKILL: the kernel drops the lock with the process
    again = start_agent(tmp_path, backend="fake", name="a")
    again.stop()


def test_a_second_controller_on_an_embedded_store_exits_3_but_replicas_share_a_db_and_its_state_dir(
        tmp_path, postgres):
    first = start_controller(tmp_path, name="c1")
    try:
        rc, err = second(["controller", "serve", "--state-dir", str(first.state_dir),
                          "--socket", str(tmp_path / "other.sock")])
        assert rc == STARTUP_FAILURE, err
        assert f"state dir {first.state_dir} is in use by a running controller" in one_line(err)
    finally:
        first.stop()
    db = postgres.create_db("single_instance")
    replicas = [start_controller(tmp_path, name="shared", db=db)]
    try:
        # (start_controller puts each on <tmp>/<name>: the second replica's state dir is the first's)
        sock = tmp_path / "replica2.sock"
        replicas.append(p := subprocess.Popen(
            FUSE + ["controller", "serve", "--state-dir", str(tmp_path / "shared"), "--socket", str(sock),
                    "--db", db], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        assert wait_until(lambda: p.poll() is None and healthy(sock), timeout=30, what="the second replica")
    finally:
        replicas[0].stop()
        if replicas[1:]:
            replicas[1].terminate()
            replicas[1].wait(15)


def test_a_second_controller_on_an_embedded_stores_file_from_another_state_dir_exits_3(tmp_path):
    first = start_controller(tmp_path, name="c1")
    try:
        db = f"sqlite:///{first.state_dir / 'fuse.db'}"
        rc, err = second(["controller", "serve", "--state-dir", str(tmp_path / "elsewhere"),
                          "--socket", str(tmp_path / "other.sock"), "--db", db])
        assert rc == STARTUP_FAILURE, err
        assert f"the SQLite store {first.state_dir / 'fuse.db'} is in use by a running controller" in one_line(err)
    finally:
        first.stop()
    # (and a file named by --db: a second controller on it, through a symlink too, exits 3)
    mine = tmp_path / "mine.db"
    holder = start_controller(tmp_path, name="c2", db=f"sqlite:///{mine}")
    (tmp_path / "alias.db").symlink_to(mine)
    try:
        for name in ("mine.db", "alias.db"):
            rc, err = second(["controller", "serve", "--state-dir", str(tmp_path / "c3"),
                              "--socket", str(tmp_path / "third.sock"), "--db", f"sqlite:///{tmp_path / name}"])
            assert rc == STARTUP_FAILURE and "is in use by a running controller" in one_line(err), err
    finally:
        holder.stop()


def test_a_server_starting_on_a_stale_socket_keeps_it_from_a_second_one_starting_at_the_same_time(tmp_path):
    # two servers at one instant on one stale socket: both saw nothing listening, and the
    # second's unlink removed the first's fresh socket (the first then ran unreachable).
    # Each now holds <socket>.lock from before its check; here the test holds it, as a
    # server between its check and its bind would.
    import fcntl
    import os
    import socket

    sock = tmp_path / "agent.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))  # a socket file nothing listens on
    stale.close()
    inode = sock.stat().st_ino
    fd = os.open(f"{sock}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        rc, err = second(agent_args(tmp_path / "b", sock))
        assert rc == STARTUP_FAILURE, err
        assert f"socket {sock} is in use by a running" in one_line(err)
        assert sock.stat().st_ino == inode  # the starting one's file is left alone
    finally:
        os.close(fd)
    p = subprocess.Popen(FUSE + agent_args(tmp_path / "b", sock), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_until(lambda: p.poll() is None and agent_id_on(sock), timeout=30, what="the agent once the lock is free")
    finally:
        p.terminate()
        p.wait(15)


def test_a_socket_path_holding_a_file_or_a_dir_or_too_long_is_one_line_and_nothing_is_removed(tmp_path):
    """(review 25) a --socket naming a regular file deleted it (taken for a stale socket); a
    directory, or a path longer than a unix socket's, ended in a traceback."""
    notes = tmp_path / "notes.txt"
    notes.write_text("precious operator data\n")
    folder = tmp_path / "somedir"
    (folder / "inner").mkdir(parents=True)
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    long_sock = deep / "ctl.sock"
    link = tmp_path / "link"
    link.symlink_to(notes)
    for path, said in ((notes, "a regular file, not a socket"), (folder, "a directory, not a socket"),
                       (link, "a symbolic link, not a socket"),
                       (long_sock, "a unix socket's path is at most 107")):
        for args in (agent_args(tmp_path / "agent", path),
                     ["controller", "serve", "--state-dir", str(tmp_path / "ctl"), "--socket", str(path)]):
            rc, err = second(args)
            assert rc == 1 and f"error: io_error: --socket {path}" in one_line(err) and said in err, (args, err)
    assert notes.read_text() == "precious operator data\n" and link.is_symlink()
    assert (folder / "inner").is_dir() and list(deep.iterdir()) == []
