"""`fuse bundle build --name` takes a bundle name (the VM name pattern: it
becomes a directory under STATE/bundles): anything else is one error line,
`invalid_argument`, exit 2, like any bad flag, and nothing is fetched or
written. The real command, as a user runs it."""

from __future__ import annotations

import json
import subprocess

import pytest

from support import FUSE


@pytest.mark.parametrize("name", ["../evil", "Linux", "a/b", "", ".x"],
                         ids=["a path out of the bundles dir", "upper case", "a slash", "empty",
                              "a dot first"])
@pytest.mark.parametrize("as_json", [False, True], ids=["for people", "--json"])
def test_a_bad_bundle_name_is_one_invalid_argument_line_and_exit_2(tmp_path, name, as_json):
    state = tmp_path / "state"
    r = subprocess.run(FUSE + ["bundle", "build", "--state-dir", str(state), "--name", name,
                               "--kernel-deb", str(tmp_path / "never-read.deb")] + (["--json"] if as_json else []),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr
    [line] = r.stderr.splitlines()
    if as_json:
        err = json.loads(line)["error"]
        assert err["code"] == "invalid_argument" and err["message"].startswith("--name: ")
    else:
        assert line.startswith("error: invalid_argument: --name: ") and "is not a bundle name" in line
    assert not state.exists()


def test_a_kernel_package_that_cannot_be_read_is_one_io_error_line_and_exit_1(tmp_path):
    r = subprocess.run(FUSE + ["bundle", "build", "--state-dir", str(tmp_path / "state"),
                               "--kernel-deb", str(tmp_path / "missing.deb")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith("error: io_error: ") and "missing.deb" in line, line


@pytest.mark.parametrize("kernel", [None, b"not a kernel"], ids=["no /boot/vmlinuz-*", "a vmlinuz that is not xz"])
def test_a_kernel_package_with_no_kernel_it_can_boot_is_one_invalid_argument_line_and_exit_2(tmp_path, kernel):
    # (a cloud kernel's .deb, say, whose bzImage is not xz-compressed: it was a 30-line traceback)
    pkg = tmp_path / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text("Package: not-a-kernel\nVersion: 1\nArchitecture: all\n"
                                            "Maintainer: t <t@t>\nDescription: t\n")
    if kernel is not None:
        (pkg / "boot").mkdir()
        (pkg / "boot" / "vmlinuz-6.1.0-test").write_bytes(kernel)
    else:
        (pkg / "usr").mkdir()
        (pkg / "usr" / "README").write_text("nothing here")
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(pkg), str(tmp_path / "k.deb")],
                   check=True, capture_output=True)
    r = subprocess.run(FUSE + ["bundle", "build", "--state-dir", str(tmp_path / "state"),
                               "--kernel-deb", str(tmp_path / "k.deb")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.splitlines()[-1]
    assert line.startswith(f"error: invalid_argument: --kernel-deb {tmp_path / 'k.deb'}: "), line
    assert ("holds no /boot/vmlinuz-*" if kernel is None else "no xz-compressed ELF kernel") in line, line
