"""Guest bundles: the kernel and initramfs every fuse VM boots.

A bundle is a directory ``<state-dir>/bundles/<name>/`` holding

- ``vmlinux``: the uncompressed kernel pulled out of Debian's
  ``linux-image-<version>-amd64`` bzImage. It has a PVH entry point, so QEMU's
  microvm boots it directly and skips the in-guest decompressor (about 3x
  faster under TCG, see QEMU-NOTES.md);
- ``initrd.cpio.gz``: busybox-static, its applet links and fuse's guest init;
- ``manifest.json``: name, kernel and busybox versions, file hashes and the
  fingerprint.

The build is reproducible: the cpio archive is written here (sorted entries,
fixed inode numbers, mtime 0, owner root) and gzipped with mtime 0, so the same
inputs give the same bytes and the same SHA-256 fingerprint on every host. The
controller relies on that: a sleeping VM may only move to a host whose bundle
has the same fingerprint.

Reading a bundle checks it (``load_bundle``): its name follows the VM name
pattern, its manifest has a fingerprint, a kernel and a ``{file: sha256}``
map, the fingerprint is the one those hashes give, and each file hashes to
what the manifest says. A bundle failing any of it is not offered: listings
skip it (the reason is logged once) and ``get_bundle`` answers None, so one bad
directory never breaks ``GET /v1/host``, and a VM never boots a kernel that is
not the one its fingerprint names. Hashes are cached per file by device,
inode, size and mtime, so the controller's poll every second only stats the
files; a file is hashed again when it changes. A manifest listing no files
is a stand-in for a backend that boots nothing (the fake backend): its
fingerprint is taken as written. Whether a bundle boots *here* is the
backend's to say: the agent reads bundles with the files its backend boots
from (``needs``, ``Backend.bundle_files``), so on QEMU or Firecracker such a
stand-in is not offered and a create naming it is refused with the reason,
before any process starts (it used to reach QEMU and end in 500).
"""

from __future__ import annotations

import gzip
import functools
import hashlib
import io
import json
import logging
import lzma
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import InvalidArgument
from ..models.vm import NAME_PATTERN
from .probe import transient

FORMAT = 1  # bump when the bundle layout or packing changes
BOOT_FILES = ("vmlinux", "initrd.cpio.gz")  # what a bundle that boots must list
_XZ_MAGIC = b"\xfd7zXZ\x00"
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # a plain name inside the bundle dir
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
Progress = Callable[[str], None]
log = logging.getLogger("fuse.bundle")


@dataclass(frozen=True)
class Bundle:
    """A built bundle on this host."""

    name: str
    path: Path
    fingerprint: str
    kernel: str
    files: tuple[str, ...] = ()  # what its manifest lists (none: a stand-in that boots nothing)

    @property
    def vmlinux(self) -> Path:
        return self.path / "vmlinux"

    @property
    def initrd(self) -> Path:
        return self.path / "initrd.cpio.gz"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def guest_init() -> bytes:
    """fuse's guest init script (package data)."""
    return resources.files("fuse.agent").joinpath("guest/init").read_bytes()


@functools.lru_cache(maxsize=1)
def _init_sha256() -> str:
    return hashlib.sha256(guest_init()).hexdigest()


# -- kernel -----------------------------------------------------------------

def kernel_package() -> str:
    """The versioned kernel package that ``linux-image-amd64`` points at,
    e.g. ``linux-image-6.1.0-57-amd64``."""
    out = subprocess.run(["apt-cache", "depends", "linux-image-amd64"], capture_output=True,
                         text=True, check=True).stdout
    m = re.search(r"Depends:\s*(linux-image-\S+-amd64)", out)
    if not m:
        raise RuntimeError(f"apt-cache depends linux-image-amd64 names no kernel:\n{out}")
    return m.group(1)


def fetch_kernel_deb(cache_dir: Path, package: str | None = None, progress: Progress = print) -> Path:
    """The kernel .deb, downloaded once with ``apt-get download`` and kept in
    ``cache_dir`` (70 MB: every later build reuses it)."""
    package = package or kernel_package()
    cache_dir.mkdir(parents=True, exist_ok=True)
    found = sorted(cache_dir.glob(f"{package}_*.deb"))
    if found:
        return found[-1]
    progress(f"downloading {package}")
    # apt-get download writes into its cwd; a scratch dir keeps half-written
    # files out of the cache.
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        subprocess.run(["apt-get", "download", "-q", package], cwd=tmp, check=True,
                       capture_output=True)
        deb = next(Path(tmp).glob(f"{package}_*.deb"))
        return Path(shutil.move(str(deb), cache_dir / deb.name))


def read_bzimage(deb: Path) -> tuple[str, bytes]:
    """(kernel release, bzImage bytes) from a linux-image .deb. Only the one
    member is unpacked (``dpkg -x`` would write ~400 MB of modules we never
    use)."""
    data = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True,
                          check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            m = re.fullmatch(r"\.?/?boot/vmlinuz-(.+)", member.name)
            if m and member.isfile():
                return m.group(1), tar.extractfile(member).read()
    raise RuntimeError(f"{deb.name} holds no /boot/vmlinuz-*")


def extract_vmlinux(bzimage: bytes) -> bytes:
    """The uncompressed ELF kernel inside a bzImage whose payload is xz:
    find the xz magic and decompress from there (trailing data after the
    stream is ignored)."""
    start = 0
    while (at := bzimage.find(_XZ_MAGIC, start)) >= 0:
        try:
            out = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(bzimage[at:])
        except lzma.LZMAError:
            out = b""
        if out.startswith(b"\x7fELF"):
            return out
        start = at + 1
    raise RuntimeError("no xz-compressed ELF kernel found in the bzImage")


# -- initramfs ---------------------------------------------------------------

def _cpio_entry(ino: int, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> bytes:
    """One ``newc`` record with fixed owner (root) and mtime (0)."""
    nlink = 2 if stat.S_ISDIR(mode) else 1
    fields = [ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdev[0], rdev[1], len(name) + 1, 0]
    head = b"070701" + b"".join(b"%08X" % f for f in fields) + name.encode() + b"\0"
    head += b"\0" * (-len(head) % 4)
    return head + data + b"\0" * (-len(data) % 4)


def build_initramfs(busybox: Path, init: bytes, applets: list[str]) -> bytes:
    """A gzipped newc cpio: /bin/busybox, one symlink per applet, /init and
    /dev/console (the kernel opens it for init before devtmpfs exists)."""
    dirs = {"bin", "dev", "etc", "proc", "root", "sbin", "sys", "tmp", "usr", "usr/bin", "usr/sbin"}
    files: dict[str, tuple[int, bytes, tuple[int, int]]] = {
        "bin/busybox": (stat.S_IFREG | 0o755, busybox.read_bytes(), (0, 0)),
        "init": (stat.S_IFREG | 0o755, init, (0, 0)),
        "dev/console": (stat.S_IFCHR | 0o600, b"", (5, 1)),
    }
    for applet in applets:
        applet = applet.strip("/")
        # Linking busybox to itself would overwrite the binary.
        if applet and applet != "bin/busybox" and applet not in files:
            dirs.add(os.path.dirname(applet))
            files[applet] = (stat.S_IFLNK | 0o777, b"/bin/busybox", (0, 0))
    entries = [(d, stat.S_IFDIR | 0o755, b"", (0, 0)) for d in dirs if d]
    entries += [(name, *spec) for name, spec in files.items()]
    out = io.BytesIO()
    for ino, (name, mode, data, rdev) in enumerate(sorted(entries), start=1):
        out.write(_cpio_entry(ino, name, mode, data, rdev))
    out.write(_cpio_entry(0, "TRAILER!!!", 0))
    gz = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=gz, mtime=0, compresslevel=6) as f:
        f.write(out.getvalue())
    return gz.getvalue()


def busybox_info(busybox: Path) -> tuple[str, list[str]]:
    """(version, applet paths) of a busybox binary."""
    banner = subprocess.run([str(busybox)], capture_output=True, text=True).stdout
    m = re.search(r"BusyBox (v\S+)", banner)
    applets = subprocess.run([str(busybox), "--list-full"], capture_output=True, text=True,
                             check=True).stdout.split()
    return (m.group(1) if m else "unknown"), sorted(applets)


# -- bundles -----------------------------------------------------------------

def fingerprint(files: dict[str, str]) -> str:
    """SHA-256 over the sorted (file name, file hash) pairs: the content of a
    bundle, independent of its name or where it was built."""
    text = "".join(f"{name} {digest}\n" for name, digest in sorted(files.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def _make_parents(path: Path) -> None:
    """Create ``path`` and its missing parents 0755 whatever the umask: an agent refuses a state
    dir the group or others may write to, and `mkdir(parents=True)` under umask 002 made the state
    dir a first `fuse bundle build` (or `fuse up`) created 0775 (review 38). Readable by all, as the
    bundle's own dir is; directories that already exist are left as they are."""
    missing = []
    while not path.exists() and path.parent != path:
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o755)  # (never, for a moment, what the umask leaves: 0777 under umask 000)
        except FileExistsError:  # (made meanwhile, by someone else: not ours to change)
            continue
        d.chmod(0o755)


def build_bundle(state_dir: Path, name: str = "linux", *, cache_dir: Path | None = None,
                 kernel_deb: Path | None = None, busybox: Path = Path("/bin/busybox"),
                 progress: Progress = print) -> dict[str, Any]:
    """Build (or confirm) bundle ``name`` under ``state_dir/bundles`` and
    return its manifest. A bundle whose recorded inputs match is left alone,
    so repeated builds are cheap. A name that is not a bundle name (the VM
    name pattern) is ``InvalidArgument``, before anything is fetched."""
    if why := name_problem(name):
        raise InvalidArgument(why)
    cache_dir = cache_dir or state_dir / "cache"
    deb = kernel_deb or fetch_kernel_deb(cache_dir, progress=progress)
    init = guest_init()
    inputs = {"format": FORMAT, "kernel_deb": deb.name, "kernel_deb_sha256": sha256_file(deb),
              "busybox_sha256": sha256_file(busybox), "init_sha256": hashlib.sha256(init).hexdigest()}
    dest = state_dir / "bundles" / name
    existing = _read_manifest(dest)
    if (isinstance(existing, dict) and existing.get("inputs") == inputs
            and isinstance(load_bundle(state_dir, name), Bundle)):
        progress(f"bundle {name} is up to date ({existing['fingerprint'][:12]})")
        return existing

    progress(f"extracting kernel from {deb.name}")
    release, bzimage = read_bzimage(deb)
    vmlinux = extract_vmlinux(bzimage)
    progress("packing initramfs")
    bb_version, applets = busybox_info(busybox)
    initrd = build_initramfs(busybox, init, applets)

    files = {"vmlinux": hashlib.sha256(vmlinux).hexdigest(),
             "initrd.cpio.gz": hashlib.sha256(initrd).hexdigest()}
    manifest = {"name": name, "format": FORMAT, "kernel": release, "busybox": bb_version,
                "files": files, "fingerprint": fingerprint(files), "inputs": inputs}
    # Write into a sibling dir and swap it in, so a crash never leaves a
    # half-written bundle that running VMs or the probe would see.
    _make_parents(dest.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=dest.parent))
    tmp.chmod(0o755)
    (tmp / "vmlinux").write_bytes(vmlinux)
    (tmp / "initrd.cpio.gz").write_bytes(initrd)
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    swap_in(tmp, dest)  # (a running VM keeps its open kernel file: replacing the dir is safe)
    progress(f"bundle {name}: kernel {release}, busybox {bb_version}, "
             f"fingerprint {manifest['fingerprint'][:12]}")
    return manifest


RENAME_EXCHANGE, AT_FDCWD = 2, -100  # renameat2(2)


def swap_in(tmp: Path, dest: Path) -> None:
    """Put the dir ``tmp`` in ``dest``'s place in one step, then remove the old one: a
    create or wake on a serving agent never finds no bundle (review 28: removed first, then
    renamed, a rebuild left a moment where creates were refused "its vmlinux is missing").
    renameat2's RENAME_EXCHANGE swaps the two; where the file system or libc has none,
    the old dir is removed first, as before."""
    if dest.exists():
        import ctypes

        renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
        if renameat2 is not None and renameat2(AT_FDCWD, os.fsencode(tmp), AT_FDCWD, os.fsencode(dest),
                                               RENAME_EXCHANGE) == 0:
            shutil.rmtree(tmp)  # (the old bundle, now under the temporary name)
            return
        shutil.rmtree(dest)
    tmp.rename(dest)


def _read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a bundle (it becomes a directory name), or None."""
    if not re.fullmatch(NAME_PATTERN, name):
        return (f"{name!r} is not a bundle name: 1-63 characters of a-z, 0-9, '_', '.' and '-', "
                f"starting with a letter or digit")
    return None


# path -> ((st_dev, st_ino, st_size, st_mtime_ns), sha256)
_hashes: dict[str, tuple[tuple[int, int, int, int], str]] = {}


def _cached_sha256(path: Path) -> str | None:
    """The file's SHA-256, or None when it is not a regular file. Hashed
    again only when its identity, size or mtime changed."""
    try:
        st = path.stat()
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    key, at = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), os.path.abspath(path)
    hit = _hashes.get(at)
    if hit is not None and hit[0] == key:
        return hit[1]
    digest = sha256_file(path)
    # The key is from before hashing: a file rewritten meanwhile differs from it
    # and is hashed again on the next read.
    _hashes[at] = (key, digest)
    return digest


def _check(path: Path, needs: tuple[str, ...] = ()) -> Bundle | str:
    """The bundle in directory ``path``, or why it cannot be used by a
    backend that boots from the files ``needs``."""
    if why := name_problem(path.name):
        return why
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except FileNotFoundError:
        return "it has no manifest.json"
    except OSError as exc:
        if transient(exc):  # (says nothing of the bundle: `_checked` answers for it)
            raise
        return f"its manifest.json cannot be read ({exc.strerror or exc})"
    except ValueError:
        return "its manifest.json is not JSON"
    if not isinstance(manifest, dict):
        return "its manifest.json is not a JSON object"
    fp, kernel, files = manifest.get("fingerprint"), manifest.get("kernel"), manifest.get("files")
    if not isinstance(fp, str) or not fp:
        return "its manifest has no fingerprint"
    if not isinstance(kernel, str):
        return "its manifest has no kernel"
    if manifest.get("format", FORMAT) != FORMAT:
        return f"its manifest is format {manifest['format']!r}; this agent reads format {FORMAT}"
    built_init = (manifest.get("inputs") or {}).get("init_sha256") if isinstance(manifest.get("inputs"), dict) else None
    if files and built_init is not None and built_init != _init_sha256():
        # the guest's init speaks to this agent (its exit line, its nonce, standby): one from
        # another fuse would have every VM that ends recorded failed, or never claimed
        return (f"its guest init is not this fuse's (built by another version of fuse): "
                f"rebuild it (fuse bundle build --name {path.name})")
    if not isinstance(files, dict) or not all(
            isinstance(f, str) and _FILE_NAME.fullmatch(f) and isinstance(h, str) and _HEX64.fullmatch(h)
            for f, h in files.items()):
        return "its manifest's files is not a map of plain file names to SHA-256 hex digests"
    if files:  # none listed: a stand-in for a backend that boots nothing
        if missing := [f for f in BOOT_FILES if f not in files]:
            return f"its manifest lists no {missing[0]}"
        if fp != fingerprint(files):
            return "its fingerprint is not the one its files' hashes give"
        for f, want in sorted(files.items()):
            try:
                got = _cached_sha256(path / f)
            except OSError as exc:
                if transient(exc):
                    raise
                return f"its {f} cannot be read ({exc.strerror or exc})"
            if got is None:
                return f"its {f} is missing"
            if got != want:
                return f"its {f} does not match the manifest (sha256 {got[:12]}, manifest {want[:12]})"
    if missing := [f for f in needs if f not in files]:
        if not files:
            return (f"its manifest lists no files (a stand-in for a backend that boots nothing), and "
                    f"this host's backend boots from {' and '.join(needs)}")
        return f"its manifest lists no {missing[0]}, which this host's backend boots from"
    return Bundle(name=path.name, path=path, fingerprint=fp, kernel=kernel, files=tuple(sorted(files)))


# bundle dir -> the reason last logged for it, so a bad bundle is logged once,
# not on every poll
_reported: dict[str, str] = {}


def _report(path: Path, result: Bundle | str) -> None:
    at = os.path.abspath(path)
    if isinstance(result, Bundle):
        _reported.pop(at, None)
    elif _reported.get(at) != result:
        _reported[at] = result
        log.warning("bundle %s is not usable and is skipped: %s", path, result)


# (bundle dir, files it must list) -> the Bundle its last check found, and those whose check
# cannot be made now; bundles dir -> its last listing
_last_good: dict[tuple[str, tuple[str, ...]], Bundle] = {}
_unsure: set[tuple[str, tuple[str, ...]]] = set()
_last_listing: dict[tuple[str, tuple[str, ...]], list[dict[str, str]]] = {}


def _checked(path: Path, needs: tuple[str, ...]) -> Bundle | str:
    """``_check``'s answer, reported (`_report`). A check that cannot be made now (``transient``:
    an agent at its fd limit cannot open the manifest) says nothing of the bundle: its last
    check's Bundle stands, logged once until a check can be made. Review 37: read as "not
    usable", the bundle left the host's summary, and creates placed there were refused 400
    "has no bundle" while it was there all along."""
    at = (os.path.abspath(path), needs)
    try:
        result = _check(path, needs)
    except OSError as exc:
        if not transient(exc):  # (`_check` answers every other failure to read as a reason)
            raise
        last = _last_good.get(at)
        if at not in _unsure:
            _unsure.add(at)
            log.warning("bundle %s cannot be checked now (%s): %s", path, exc.strerror or exc,
                        "its last check stands until it can" if last else "it is left out until it can be")
        return last if last is not None else f"it cannot be checked now ({exc.strerror or exc}); try again"
    _unsure.discard(at)
    if isinstance(result, Bundle):
        _last_good[at] = result
    else:
        _last_good.pop(at, None)
    _report(path, result)
    return result


def load_bundle(state_dir: Path, name: str, needs: tuple[str, ...] = ()) -> Bundle | str:
    """The built bundle ``name``, checked against its manifest and listing
    the files ``needs`` (what the caller's backend boots from), or why there
    is none to use (a value, for error messages)."""
    if why := name_problem(name):
        return why
    path = state_dir / "bundles" / name
    if not path.is_dir():
        return f"no bundle named {name} on this host (fuse bundle build --name {name})"
    result = _checked(path, needs)
    return result if isinstance(result, Bundle) else f"bundle {name} is not usable: {result}"


def get_bundle(state_dir: Path, name: str, needs: tuple[str, ...] = ()) -> Bundle | None:
    """The built bundle ``name``, or None (absent, or failing its checks:
    ``load_bundle`` says why)."""
    b = load_bundle(state_dir, name, needs)
    return b if isinstance(b, Bundle) else None


def list_bundles(state_dir: Path, needs: tuple[str, ...] = ()) -> list[dict[str, str]]:
    """Every usable bundle on this host (listing the files ``needs``):
    ``[{name, fingerprint, kernel}]``. A bad one is left out (and logged),
    never an error: ``GET /v1/host`` lists these, and the controller places
    a VM only on a host that lists its bundle."""
    root = state_dir / "bundles"
    out: list[dict[str, str]] = []
    at = (os.path.abspath(root), needs)
    try:
        paths = sorted(root.iterdir())
    except OSError as exc:
        if transient(exc):  # (listing a dir takes an fd too: the last listing stands, as in `_checked`)
            if at not in _unsure:
                _unsure.add(at)
                log.warning("bundles dir %s cannot be listed now (%s): its last listing stands until it can",
                            root, exc.strerror or exc)
            return list(_last_listing.get(at, out))
        return out  # no bundles dir yet
    _unsure.discard(at)
    for path in paths:
        # dot dirs are builds under way (see build_bundle)
        if path.name.startswith(".") or not path.is_dir():
            continue
        result = _checked(path, needs)
        if isinstance(result, Bundle):
            out.append({"name": result.name, "fingerprint": result.fingerprint, "kernel": result.kernel})
    _last_listing[at] = out
    return list(out)
