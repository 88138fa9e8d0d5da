"""Issue 3: "the host probe lists the bundles it has", and one bad bundle
directory never takes `GET /v1/host` down (the controller polls it every
second). A bundle is offered only when its manifest is whole and its files
hash to the fingerprint it names; the rest are skipped with the reason
logged once, and a create naming one is 400, never 500."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil

import httpx
import pytest

from support import fake_bundle, install_bundle, reap, start_agent
from fuse.agent import bundle as b
from fuse.errors import InvalidArgument


def make_bundle(state, name="tiny", kernel=b"\x7fELF tiny kernel", initrd=b"tiny initrd") -> dict:
    """A small bundle whose manifest is right (what build_bundle writes, minus the build)."""
    d = state / "bundles" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "vmlinux").write_bytes(kernel)
    (d / "initrd.cpio.gz").write_bytes(initrd)
    files = {"vmlinux": hashlib.sha256(kernel).hexdigest(), "initrd.cpio.gz": hashlib.sha256(initrd).hexdigest()}
    manifest = {"name": name, "format": b.FORMAT, "kernel": "6.1-test", "files": files,
                "fingerprint": b.fingerprint(files)}
    (d / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def write_manifest(state, name, manifest) -> None:
    d = state / "bundles" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "manifest.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))


def tampered(state, name="bad") -> None:
    """A bundle dir with a good manifest copied in and another kernel."""
    good = make_bundle(state, name)
    (state / "bundles" / name / "vmlinux").write_bytes(b"\x7fELF not the kernel the manifest names")
    assert json.loads((state / "bundles" / name / "manifest.json").read_text()) == good


BAD = {
    "no fingerprint": lambda s: write_manifest(s, "bad", {"name": "bad", "files": {}}),
    "not JSON": lambda s: write_manifest(s, "bad", "{not json"),
    "not an object": lambda s: write_manifest(s, "bad", [1, 2]),
    "files not a map": lambda s: write_manifest(s, "bad", {"fingerprint": "x", "kernel": "k", "files": ["vmlinux"]}),
    "a file name with a path": lambda s: write_manifest(s, "bad", {
        "fingerprint": "x", "kernel": "k", "files": {"../vmlinux": "0" * 64}}),
    "no kernel file listed": lambda s: write_manifest(s, "bad", {
        "fingerprint": b.fingerprint({"initrd.cpio.gz": "0" * 64}), "kernel": "k",
        "files": {"initrd.cpio.gz": "0" * 64}}),
    "fingerprint not of its files": lambda s: (make_bundle(s, "bad"), write_manifest(s, "bad", {
        **json.loads((s / "bundles/bad/manifest.json").read_text()), "fingerprint": "f" * 64})),
    "a file missing": lambda s: (make_bundle(s, "bad"), (s / "bundles/bad/initrd.cpio.gz").unlink()),
    "a file that is not the one hashed": tampered,
    "another format": lambda s: write_manifest(s, "bad", {
        **make_bundle(s, "bad"), "format": b.FORMAT + 1}),
    # (review 21: a bundle built before the exit line carried the boot's nonce had every VM
    # that ended recorded failed, and was listed like any other)
    "another fuse's guest init": lambda s: write_manifest(s, "bad", {
        **make_bundle(s, "bad"), "inputs": {"init_sha256": "0" * 64}}),
    "a directory name no bundle may have": lambda s: shutil.move(make_bundle(s, "x") and s / "bundles/x",
                                                                 s / "bundles/Bad Name"),
}


@pytest.mark.parametrize("spoil", BAD.values(), ids=[f"a bundle with {k} is skipped" for k in BAD])
def test_a_bad_bundle_is_skipped_with_its_reason_logged_and_the_good_ones_listed(tmp_path, caplog, spoil):
    good = make_bundle(tmp_path, "linux")
    spoil(tmp_path)
    with caplog.at_level(logging.WARNING, logger="fuse.bundle"):
        listed = b.list_bundles(tmp_path)
    assert listed == [{"name": "linux", "fingerprint": good["fingerprint"], "kernel": "6.1-test"}]
    [said] = [r.getMessage() for r in caplog.records if r.name == "fuse.bundle"]
    assert "is not usable and is skipped: " in said

    # Once per bundle and reason: the poll every second does not fill the log.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fuse.bundle"):
        assert b.list_bundles(tmp_path) == listed
    assert not [r for r in caplog.records if r.name == "fuse.bundle"]
    assert b.get_bundle(tmp_path, "bad") is None and b.get_bundle(tmp_path, "linux").fingerprint == good["fingerprint"]


def test_a_bundle_built_with_another_init_says_to_rebuild_it_and_one_with_this_init_is_used(tmp_path):
    stale = make_bundle(tmp_path, "old")
    write_manifest(tmp_path, "old", {**stale, "inputs": {"init_sha256": "0" * 64}})
    assert b.load_bundle(tmp_path, "old") == ("bundle old is not usable: its guest init is not this fuse's (built "
                                              "by another version of fuse): rebuild it (fuse bundle build --name old)")
    this = make_bundle(tmp_path, "new")
    write_manifest(tmp_path, "new", {**this, "inputs": {"init_sha256": hashlib.sha256(b.guest_init()).hexdigest()}})
    assert b.get_bundle(tmp_path, "new").fingerprint == this["fingerprint"]


def test_why_a_bundle_cannot_be_used_is_a_value(tmp_path):
    tampered(tmp_path)
    assert b.load_bundle(tmp_path, "bad").startswith("bundle bad is not usable: its vmlinux does not match the manifest")
    assert b.load_bundle(tmp_path, "nosuch") == "no bundle named nosuch on this host (fuse bundle build --name nosuch)"
    assert "is not a bundle name" in b.load_bundle(tmp_path, "../bad")


def test_a_stand_in_bundle_listing_no_files_keeps_its_fingerprint(tmp_path):
    """The fake backend boots nothing: its bundle is a manifest alone."""
    fake_bundle(tmp_path, fingerprint="another-bundle")
    assert b.list_bundles(tmp_path) == [{"name": "linux", "fingerprint": "another-bundle", "kernel": "fake"}]


def test_files_are_hashed_once_and_again_only_when_they_change(tmp_path, monkeypatch):
    manifest = make_bundle(tmp_path, "linux")
    hashed = []
    real = b.sha256_file
    monkeypatch.setattr(b, "sha256_file", lambda p: hashed.append(p.name) or real(p))
    for _ in range(5):  # the controller's poll
        assert b.list_bundles(tmp_path)[0]["fingerprint"] == manifest["fingerprint"]
        assert b.get_bundle(tmp_path, "linux") is not None
    assert sorted(hashed) == ["initrd.cpio.gz", "vmlinux"]

    # Rewritten in place (same size), with a new mtime: hashed again, and refused.
    kernel = tmp_path / "bundles/linux/vmlinux"
    st = kernel.stat()
    kernel.write_bytes(b"\x7fELF tiny kernex")
    os.utime(kernel, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert b.list_bundles(tmp_path) == [] and hashed.count("vmlinux") == 2


def test_a_build_over_a_damaged_bundle_builds_it_again(tmp_path, monkeypatch):
    """build_bundle's "up to date" check hashes the files too: recorded
    inputs that match do not make a damaged bundle current."""
    deb, busybox = tmp_path / "linux-image-test-amd64_1_amd64.deb", tmp_path / "busybox"
    deb.write_bytes(b"a kernel package")
    busybox.write_bytes(b"a busybox")
    inputs = {"format": b.FORMAT, "kernel_deb": deb.name, "kernel_deb_sha256": b.sha256_file(deb),
              "busybox_sha256": b.sha256_file(busybox), "init_sha256": hashlib.sha256(b.guest_init()).hexdigest()}
    manifest = make_bundle(tmp_path, "linux")
    write_manifest(tmp_path, "linux", {**manifest, "inputs": inputs})
    said = []
    assert b.build_bundle(tmp_path, "linux", kernel_deb=deb, busybox=busybox, progress=said.append)["inputs"] == inputs
    assert said == [f"bundle linux is up to date ({manifest['fingerprint'][:12]})"]

    class Rebuilding(Exception):
        pass

    def read_bzimage(_deb):
        raise Rebuilding
    monkeypatch.setattr(b, "read_bzimage", read_bzimage)
    (tmp_path / "bundles/linux/vmlinux").write_bytes(b"damaged")
    with pytest.raises(Rebuilding):
        b.build_bundle(tmp_path, "linux", kernel_deb=deb, busybox=busybox, progress=said.append)


@pytest.mark.parametrize("name", ["../evil", "", "Linux", "a/b", ".hidden", "x" * 64, "linux\n"],
                         ids=["a path out of the bundles dir", "empty", "upper case", "a slash",
                              "a dot first (a build under way)", "longer than 63", "a trailing newline"])
def test_build_bundle_refuses_a_name_that_is_not_a_bundle_name_before_fetching_anything(tmp_path, monkeypatch, name):
    def fetch(*_a, **_k):
        raise AssertionError("fetched a kernel for a bad name")
    monkeypatch.setattr(b, "fetch_kernel_deb", fetch)
    with pytest.raises(InvalidArgument, match="is not a bundle name"):
        b.build_bundle(tmp_path, name, progress=lambda _m: None)
    assert not (tmp_path / "bundles").exists()


@pytest.mark.qemu
def test_an_agent_with_bad_bundles_answers_its_summary_and_refuses_creates_from_them(tmp_path, bundle_dir):
    """A real agent process, as the review ran it: `bundles/nofp` with
    `{"name":"nofp","files":{}}`, and `bundles/garbage` with the real manifest
    and another vmlinux (it booted to a 500 boot_failed before)."""
    state = tmp_path / "agent"
    install_bundle(bundle_dir, state)
    write_manifest(state, "nofp", {"name": "nofp", "files": {}})
    garbage = state / "bundles" / "garbage"
    garbage.mkdir()
    shutil.copy(bundle_dir / "manifest.json", garbage / "manifest.json")
    os.link(bundle_dir / "initrd.cpio.gz", garbage / "initrd.cpio.gz")
    (garbage / "vmlinux").write_bytes(os.urandom(1 << 20))
    agent = start_agent(tmp_path, name="agent")
    try:
        c = httpx.Client(base_url=agent.url, headers={"Authorization": f"Bearer {agent.token}"}, timeout=60)
        for _ in range(2):  # the controller's poll, twice
            r = c.get("/v1/host")
            assert r.status_code == 200, r.text
            assert [x["name"] for x in r.json()["bundles"]] == ["linux"]
        for name in ("nofp", "garbage"):
            r = c.post("/v1/host/vms", json={"name": f"from-{name}", "shape": {"vcpus": 1, "mem_mib": 128},
                                             "entry": "true", "bundle": name})
            assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), r.text
            assert name in r.json()["error"]["message"]
        assert c.get("/v1/host/vms").json()["vms"] == []
        log = agent.logs()
        assert "bundles/nofp is not usable and is skipped: its manifest has no fingerprint" in log
        assert "bundles/garbage is not usable and is skipped: its vmlinux does not match the manifest" in log
        assert log.count("bundles/nofp is not usable") == 1
    finally:
        agent.stop()
        reap(str(state))
