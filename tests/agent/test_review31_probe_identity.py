"""The agent's identity, from review 31 (finding 2): an `agent-id` file emptied or removed
in a state dir that holds an agent's state (its event log, its VMs) is not replaced by a new
identity without a word (a controller took the agent for another machine and read its whole
event log a second time): the agent refuses to start, saying how to restore it. A new state
dir, or one whose file was torn before anything else was written, still gets one."""

from __future__ import annotations

import subprocess

import httpx
import pytest

from support import FUSE, free_port, start_agent


def serve(tmp_path, name: str = "a1") -> subprocess.CompletedProcess | None:
    """`fuse host serve` on ``tmp_path/name``: how it ended, or None when it serves (stopped)."""
    args = [*FUSE, "host", "serve", "--listen", f"127.0.0.1:{free_port()}", "--token", "agent-token",
            "--state-dir", str(tmp_path / name), "--backend", "fake", "--socket", str(tmp_path / f"{name}-2.sock")]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return None
    return subprocess.CompletedProcess(args, p.returncode, out, err)


def ran_once(tmp_path, with_vm: bool) -> str:
    """An agent's state dir after a run (events; a VM with ``with_vm``): its agent id."""
    agent = start_agent(tmp_path, backend="fake", name="a1")
    auth = {"Authorization": f"Bearer {agent.token}"}
    try:
        ident = httpx.get(agent.url + "/v1/host", headers=auth, timeout=10).json()["agent_id"]
        r = httpx.post(agent.url + "/v1/host/vms", headers=auth, timeout=30, json={
            "name": "v1", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "sleep 1000"})
        assert r.status_code == 201, r.text
        if not with_vm:
            assert httpx.delete(agent.url + "/v1/host/vms/v1", headers=auth, timeout=30).status_code in (200, 204)
    finally:
        agent.stop()
    return ident


@pytest.mark.parametrize("damage, with_vm", [
    ("empty", True), ("missing", True), ("empty", False),
], ids=["an emptied file in a dir with a vm", "a removed file in a dir with a vm",
        "an emptied file in a dir with only an event log"])
def test_an_agent_whose_identity_file_is_gone_refuses_to_start_saying_how_to_restore_it(tmp_path, damage, with_vm):
    ident = ran_once(tmp_path, with_vm)
    path = tmp_path / "a1" / "agent-id"
    if damage == "empty":
        path.write_text("")
    else:
        path.unlink()
    ended = serve(tmp_path)
    # (was: it served under a new identity, and a controller read its events again as another machine's)
    assert ended is not None, "the agent started with a new identity"
    assert ended.returncode == 1, (ended.returncode, ended.stderr)
    said = ended.stderr.strip()
    assert said.startswith(f"error: io_error: state dir {tmp_path / 'a1'} holds an agent's state"), said
    assert f"its identity file {path} is {damage}" in said, said
    assert "fuse controller hosts list --json" in said and len(said.splitlines()) == 1, said
    assert (path.read_text() if path.exists() else None) == ("" if damage == "empty" else None)  # (untouched)
    path.write_text(ident + "\n")  # restored as the message says: the same agent again
    agent = start_agent(tmp_path, backend="fake", name="a1")
    try:
        got = httpx.get(agent.url + "/v1/host", headers={"Authorization": f"Bearer {agent.token}"}, timeout=10)
        assert got.json()["agent_id"] == ident
    finally:
        agent.stop()


def test_a_new_state_dir_with_a_torn_identity_file_gets_an_identity(tmp_path):
    (tmp_path / "a1").mkdir()
    (tmp_path / "a1" / "agent-id").write_text("")  # (torn as it was first written)
    agent = start_agent(tmp_path, backend="fake", name="a1")
    try:
        ident = httpx.get(agent.url + "/v1/host", headers={"Authorization": f"Bearer {agent.token}"},
                          timeout=10).json()["agent_id"]
        assert len(ident) == 32 and (tmp_path / "a1" / "agent-id").read_text().strip() == ident
    finally:
        agent.stop()
