"""Guest bundles are reproducible: the same inputs, the same fingerprint."""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma

import pytest

from fuse.agent import bundle as b


def test_initramfs_bytes_depend_only_on_inputs(tmp_path):
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"\x7fELF fake busybox")
    one = b.build_initramfs(busybox, b"#!/bin/sh\n", ["bin/sh", "sbin/poweroff", "bin/busybox"])
    two = b.build_initramfs(busybox, b"#!/bin/sh\n", ["sbin/poweroff", "bin/sh"])  # order does not matter
    assert one == two
    assert b.build_initramfs(busybox, b"#!/bin/sh\necho\n", ["bin/sh"]) != one
    raw = gzip.decompress(one)
    assert raw.startswith(b"070701") and b"TRAILER!!!" in raw
    assert raw.count(b"bin/busybox\0") == 1  # an applet link never overwrites busybox itself
    assert b"dev/console" in raw and b"init\0" in raw


def test_vmlinux_is_found_after_the_xz_magic():
    elf = b"\x7fELF" + bytes(range(256)) * 64
    bzimage = b"MZ setup code \xfd7zXZ\x00 not really" + lzma.compress(elf, format=lzma.FORMAT_XZ) + b"trailer"
    assert b.extract_vmlinux(bzimage) == elf
    with pytest.raises(RuntimeError):
        b.extract_vmlinux(b"MZ no payload")


def test_the_fingerprint_covers_content_not_order():
    assert b.fingerprint({"a": "1", "b": "2"}) == b.fingerprint({"b": "2", "a": "1"})
    assert b.fingerprint({"a": "1", "b": "2"}) != b.fingerprint({"a": "1", "b": "3"})


@pytest.mark.qemu
def test_the_real_bundle_rebuilds_to_the_same_fingerprint(bundle_dir, tmp_path):
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    assert manifest["kernel"].endswith("-amd64") and manifest["busybox"].startswith("v")
    for name, digest in manifest["files"].items():
        assert hashlib.sha256((bundle_dir / name).read_bytes()).hexdigest() == digest
    assert (bundle_dir / "vmlinux").read_bytes()[:4] == b"\x7fELF"

    # A fresh build from the same cached .deb into another state dir.
    deb = next((bundle_dir.parent.parent / "cache").glob("linux-image-*.deb"))
    again = b.build_bundle(tmp_path, "linux", kernel_deb=deb, progress=lambda _m: None)
    assert again["fingerprint"] == manifest["fingerprint"]
    assert b.list_bundles(tmp_path) == [{"name": "linux", "fingerprint": manifest["fingerprint"],
                                         "kernel": manifest["kernel"]}]
    # Unchanged inputs: the bundle is left alone.
    said = []
    b.build_bundle(tmp_path, "linux", kernel_deb=deb, progress=said.append)
    assert said == [f"bundle linux is up to date ({manifest['fingerprint'][:12]})"]


def test_a_rebuilt_bundle_is_swapped_in_with_no_moment_without_one(tmp_path):
    """Review 28: a rebuild removed the old dir, then renamed the new one in: creates on a
    serving agent in between were refused ("its vmlinux is missing"). The two are swapped."""
    import threading

    from fuse.agent.bundle import swap_in

    dest = tmp_path / "linux"
    dest.mkdir()
    (dest / "vmlinux").write_text("old")
    missing, done = [], threading.Event()

    def watch():
        while not done.is_set():
            if not (dest / "vmlinux").exists():
                missing.append(1)

    t = threading.Thread(target=watch)
    t.start()
    try:
        for i in range(300):
            new = tmp_path / f".linux-{i}"
            new.mkdir()
            (new / "vmlinux").write_text(str(i))
            swap_in(new, dest)
            assert not new.exists()  # (the old one went)
    finally:
        done.set()
        t.join()
    assert (dest / "vmlinux").read_text() == "299"
    assert not missing, f"no vmlinux seen {len(missing)} times"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["linux"]


def test_a_first_bundle_is_moved_into_place(tmp_path):
    from fuse.agent.bundle import swap_in

    (new := tmp_path / ".linux-x").mkdir()
    (new / "vmlinux").write_text("k")
    swap_in(new, tmp_path / "linux")
    assert (tmp_path / "linux" / "vmlinux").read_text() == "k" and not new.exists()
