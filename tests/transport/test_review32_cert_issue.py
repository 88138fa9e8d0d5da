"""Review 32: `fuse host cert issue --ca DIR` refuses a CA directory it cannot issue from
(invalid_argument, exit 2, naming the file, nothing written): a ca.key that is not
ca.pem's key (it wrote a certificate, exit 0, that `openssl verify` and every peer
refused), a ca.pem that is no CA's, and a ca.pem or ca.key that is not there (it was
io_error, exit 1: README says a CA file that does not load is invalid_argument)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from fuse.transport.tls import create_ca, issue_cert
from support import FUSE


def issue(ca: Path, out: Path) -> tuple[int, str]:
    r = subprocess.run(FUSE + ["host", "cert", "issue", "--ca", str(ca), "--name", "127.0.0.1", "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    return r.returncode, lines[0] if lines else r.stderr


@pytest.fixture
def two_cas(tmp_path) -> tuple[Path, Path]:
    create_ca(tmp_path / "a")
    create_ca(tmp_path / "b", name="another CA")
    return tmp_path / "a", tmp_path / "b"


def test_a_ca_key_that_is_not_the_ca_certificates_key_is_refused(tmp_path, two_cas):
    a, b = two_cas
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(a / "ca.pem", mixed / "ca.pem")
    shutil.copy(b / "ca.key", mixed / "ca.key")
    code, line = issue(mixed, tmp_path / "out")
    assert code == 2, (code, line)
    assert line == (f"error: invalid_argument: {mixed / 'ca.key'} is not the key of {mixed / 'ca.pem'} (a "
                    "certificate it signed would verify against nothing): give the directory `fuse host ca "
                    "create` made, both files from it"), line
    assert not (tmp_path / "out").exists()
    # ...while the CA's own pair still issues, and what it issues verifies against it
    code, line = issue(a, tmp_path / "good")
    assert code == 0, line
    v = subprocess.run(["openssl", "verify", "-CAfile", str(a / "ca.pem"), str(tmp_path / "good" / "127.0.0.1.pem")],
                       capture_output=True, text=True, timeout=30)
    assert v.returncode == 0, v.stdout + v.stderr


def test_a_ca_certificate_that_is_no_cas_is_refused(tmp_path, two_cas):
    a, _ = two_cas
    leaf = issue_cert(a, "127.0.0.1", tmp_path / "leaf")
    as_ca = tmp_path / "leaf-as-ca"
    as_ca.mkdir()
    shutil.copy(leaf.cert, as_ca / "ca.pem")
    shutil.copy(leaf.key, as_ca / "ca.key")
    code, line = issue(as_ca, tmp_path / "out")
    assert code == 2 and line.startswith(f"error: invalid_argument: {as_ca / 'ca.pem'} is not a CA's certificate"), \
        (code, line)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("missing", ["ca.pem", "ca.key"])
def test_a_ca_dir_missing_a_file_is_an_invalid_argument_naming_it(tmp_path, two_cas, missing):
    a, _ = two_cas
    (a / missing).unlink()
    code, line = issue(a, tmp_path / "out")
    # (it was io_error, exit 1)
    assert code == 2 and line.startswith(f"error: invalid_argument: no {missing} in {a} ({a / missing} does not "
                                         "exist): make the CA with `fuse host ca create"), (code, line)
    assert not (tmp_path / "out").exists()
