"""Review 30: a socket's directory another user owns, or others may write to, is refused
(by the controller, the agent and the SDK's default): whoever can write there can put
their own socket in the server's place and read what clients send, agent tokens included
(``/tmp/fuse-UID`` made first by another user, with no ``XDG_RUNTIME_DIR``)."""

from __future__ import annotations

import os
import subprocess

import pytest

import fuse
from support import FUSE

NOBODY = 65534


@pytest.fixture(params=["another user's", "writable by others"])
def bad_dir(tmp_path, request):
    d = tmp_path / "fuse-1000"
    d.mkdir()
    if request.param == "another user's":
        os.chown(d, NOBODY, NOBODY)
        d.chmod(0o700 | 0o055)  # (root passes the mode anyway: the owner alone refuses it)
        return d, "belongs to another user"
    d.chmod(0o777)
    return d, "writable by others"


@pytest.mark.parametrize("serve", [["controller", "serve"], ["host", "serve", "--backend", "fake"]])
def test_a_server_refuses_a_socket_dir_others_control(tmp_path, bad_dir, serve):
    d, says = bad_dir
    r = subprocess.run(FUSE + serve + ["--state-dir", str(tmp_path / "state"), "--socket", str(d / "s.sock")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and says in r.stderr, (r.returncode, r.stderr[-800:])
    assert not (d / "s.sock").exists()


def test_an_own_dir_is_taken_a_sticky_shared_one_or_another_users_link_is_not(tmp_path):
    from fuse.paths import socket_dir_problem
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    assert socket_dir_problem(own) is None
    assert socket_dir_problem(tmp_path / "missing") is None  # (made 0700 when the server starts)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # (as /tmp: others cannot remove what is not theirs, but can make a name first)
    assert "writable by others" in socket_dir_problem(sticky)
    link = tmp_path / "fuse-1000"
    link.symlink_to(own)
    import os
    os.lchown(link, NOBODY, NOBODY)  # (another user's link to a directory that passes: /tmp/fuse-UID -> /tmp)
    assert "symbolic link that belongs to another user" in socket_dir_problem(link)


def test_the_sdk_refuses_a_default_socket_in_a_dir_others_control(tmp_path, bad_dir, monkeypatch):
    d, says = bad_dir
    import fuse.controller.service as service
    monkeypatch.delenv("FUSE_URL", raising=False)
    monkeypatch.setattr(service, "default_controller_socket", lambda: d / "fuse-controller.sock")
    with pytest.raises(ValueError, match=says):
        fuse.Client()
