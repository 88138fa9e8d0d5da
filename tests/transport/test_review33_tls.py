"""Review 33: `fuse host ca create --force` and `cert issue --force` wrote the new
private key into the old file in place (the same inode), so whoever had the old
key file open (it was left readable: the reason to rotate) read the new key
through that descriptor; and a symbolic link planted at the key's path was
followed. A new file is written beside it and renamed over it now."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from fuse.transport.tls import create_ca, issue_cert
from support import FUSE


def _fuse(*args: str) -> None:
    r = subprocess.run(FUSE + list(args), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("what", ["ca", "cert"])
def test_a_forced_rotation_leaves_no_descriptor_to_the_old_file_reading_the_new_key(tmp_path, what):
    ca = tmp_path / "ca"
    _fuse("host", "ca", "create", "--out", str(ca))
    if what == "ca":
        key, cert, again = ca / "ca.key", ca / "ca.pem", ["host", "ca", "create", "--out", str(ca), "--force"]
    else:
        out = tmp_path / "h"
        again = ["host", "cert", "issue", "--ca", str(ca), "--name", "127.0.0.1", "--out", str(out), "--force"]
        _fuse(*again[:-1])
        key, cert = out / "127.0.0.1.key", out / "127.0.0.1.pem"
    key.chmod(0o644)  # an old key left loose
    old_inode = key.stat().st_ino
    with open(key, "rb") as held:  # (another user opened it while it was readable)
        old = held.read()
        _fuse(*again)
        held.seek(0)
        assert held.read() == old, "the descriptor to the old key file reads the new key"
    new = key.read_bytes()
    assert new != old and b"PRIVATE KEY" in new
    st = os.lstat(key)
    assert st.st_ino != old_inode and stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(cert).st_mode) == 0o644
    assert [p.name for p in key.parent.iterdir() if p.name.startswith(".")] == []  # (no temp file left)


def test_a_symbolic_link_at_the_keys_path_is_replaced_not_followed(tmp_path):
    ca = tmp_path / "ca"
    create_ca(ca)
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("not a key\n")
    elsewhere.chmod(0o644)
    (ca / "ca.key").unlink()
    (ca / "ca.key").symlink_to(elsewhere)
    create_ca(ca, overwrite=True)
    assert elsewhere.read_text() == "not a key\n" and stat.S_IMODE(elsewhere.stat().st_mode) == 0o644
    st = os.lstat(ca / "ca.key")
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    # A certificate issued from it is signed by the key now in place.
    files = issue_cert(ca, "127.0.0.1", tmp_path / "h")
    from cryptography import x509
    x509.load_pem_x509_certificate(files.cert.read_bytes()).verify_directly_issued_by(
        x509.load_pem_x509_certificate((ca / "ca.pem").read_bytes()))


def test_a_link_to_nowhere_at_the_keys_path_is_not_overwritten_without_force(tmp_path):
    """(It was: `exists()` follows the link, so the key was written where it pointed.)"""
    out = tmp_path / "ca"
    out.mkdir(mode=0o700)
    (out / "ca.key").symlink_to(tmp_path / "nowhere.key")
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        create_ca(out)
    assert not (tmp_path / "nowhere.key").exists()
