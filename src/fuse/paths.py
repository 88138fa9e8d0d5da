"""Default socket paths, importable without the heavier transport stack
(`fuse host relay` needs one at every SSH channel it serves)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def default_agent_socket() -> Path:
    """Where `fuse host serve` puts its socket unless told otherwise."""
    if os.geteuid() == 0:
        return Path("/run/fuse-host.sock")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "fuse-host.sock" if runtime else Path(f"/tmp/fuse-{os.getuid()}/fuse-host.sock")


def socket_dir_problem(directory: Path, any_owner: bool = False) -> str | None:
    """Why an owner-only socket cannot live in ``directory`` (one line), or None (it is
    missing: it will be made 0700). A directory another user owns, a symbolic link another
    user made, or a directory others may write to (sticky too, as /tmp is: the socket's name
    is known, so they can make it first) lets them put their own socket in the server's place
    and read what clients send it, agent tokens included (``/tmp/fuse-UID`` made first by
    another user, with no ``XDG_RUNTIME_DIR``; or made a link to /tmp). ``any_owner``: a
    directory the caller named itself may be another user's (a root relay to an agent that
    runs as its own user, in its own directory): only one others may write to is refused."""
    return unsafe_dir_problem(directory, "the socket's directory", "could put their own socket in its place",
                              "give --socket in a directory of your own", "--socket", any_owner=any_owner,
                              or_else=", or set XDG_RUNTIME_DIR")


def state_dir_access_problem(directory: Path, server: str) -> str | None:
    """Why ``server`` ("host agent", "controller") may not keep its state in ``directory``
    (one line), or None (it is missing: it will be made 0700). Another user who owns it, or
    may write to it (group or anyone, sticky or not), could rename its ``vms/`` or its
    SQLite store and put their own in its place, which the server, root as a rule, would
    then read and make files in: forged VM records, links it follows. The socket's rule."""
    harm = f"could put their own files where the {server} keeps its state"
    problem = unsafe_dir_problem(directory, "the state dir", harm, "give a --state-dir of your own", "--state-dir",
                                 sticky_ok=True)
    if problem is None and directory.is_dir() and directory.stat().st_mode & 0o002:
        # Sticky and open to all (a tmpfs as mounted): others cannot rename or remove the server's
        # entries, but one made before the server's first start is theirs (a `vms/` another user
        # made there would hold its VMs: the diff review), so none may belong to another user.
        mine = (os.geteuid(), 0)
        for entry in sorted(directory.iterdir()):
            uid = entry.lstat().st_uid
            if uid not in mine:
                return (f"the state dir {directory} is open to all (mode {directory.stat().st_mode & 0o7777:o}) "
                        f"and holds {entry.name}, which belongs to another user (uid {uid}), who {harm}: "
                        f"remove it, or give a --state-dir of your own")
    return problem


def unsafe_dir_problem(directory: Path, name: str, harm: str, instead: str, option: str, *,
                       any_owner: bool = False, or_else: str = "", sticky_ok: bool = False) -> str | None:
    """Why a server may not keep what it keeps in ``directory`` (one line, ``name`` being
    what it is to the reader, ``harm`` what others could then do, ``instead`` the way out
    but chmod), or None: it, or the symbolic link naming it, belongs to another user than
    this one or root (unless ``any_owner``), or others may write to it (unless it is sticky and
    ``sticky_ok``: a state dir on a tmpfs mounted as it comes, 1777 — others may then add entries
    but not rename or remove ours, as in /tmp)."""
    import stat
    mine = (os.geteuid(), 0)
    try:
        link = os.lstat(directory)
        st = os.stat(directory)  # (followed: a symbolic link to another user's directory is theirs)
    except FileNotFoundError:
        return None if not os.path.islink(directory) else (
            f"{name} {directory} is a symbolic link to nowhere: give {option} elsewhere")
    except OSError as exc:
        return f"{name} {directory}: {exc.strerror or exc}"
    # (a link is named as one only when it is one: a plain directory has lstat == stat)
    owners = [("is a symbolic link that ", link)] if stat.S_ISLNK(link.st_mode) else []
    for what, s in (*owners, ("", st)):
        if s.st_uid not in mine and not any_owner:
            return f"{name} {directory} {what}belongs to another user (uid {s.st_uid}), who {harm}: {instead}{or_else}"
    if st.st_mode & 0o022 and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        return (f"{name} {directory} is writable by others (mode {stat.S_IMODE(st.st_mode):o}), who {harm}: "
                f"chmod go-w {directory}, or {instead}")
    return None


def runtime_dir() -> Path:
    """A short directory of this user's for the unix sockets the agent cannot put in a
    VM's own dir (a socket path has at most 108 bytes): /run/fuse as root, else
    $XDG_RUNTIME_DIR/fuse or /tmp/fuse-UID. It depends on nothing but the user (and
    XDG_RUNTIME_DIR), so an agent started again later finds a running VM's sockets there."""
    if os.geteuid() == 0:
        return Path("/run/fuse")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and len(runtime) < 50:  # (room for the socket names in 108 bytes)
        return Path(runtime) / "fuse"
    return Path(f"/tmp/fuse-{os.getuid()}")


def our_socket(path: Path) -> bool:
    """Whether ``path`` is a unix socket this user made (not a link, nor another user's file):
    a deep VM's socket at the shared temp dir's name an agent before ``runtime_dir`` gave it,
    which a running VM of such an agent still listens on after an upgrade."""
    import stat
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISSOCK(st.st_mode) and st.st_uid == os.geteuid()


def private_runtime_dir() -> Path:
    """`runtime_dir()`, made 0700 if missing and checked to be a directory of this user's
    (not a symbolic link) that only they may enter: its socket names are predictable, so
    a directory another user made or may write to would let them put a file of their
    choosing where the agent binds, chmods or removes a socket. A problem is a
    PermissionError whose message says what to do."""
    import stat
    path = runtime_dir()
    with contextlib.suppress(FileExistsError):  # (a link to nowhere there: refused just below)
        private_dir(path)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else \
            "not a directory" if not stat.S_ISDIR(st.st_mode) else f"owned by another user (uid {st.st_uid})"
        raise PermissionError(f"the agent's socket directory {path} is {what}, so another user could put their "
                              f"own file where a VM's socket goes: remove {path} (the agent makes it afresh, "
                              "0700), or set XDG_RUNTIME_DIR to a directory of your own")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)  # (ours: tightened, as private_file does)
    return path


def private_dir(path: Path) -> Path:
    """Create `path` and any missing parents owner-only (0700) whatever the
    umask: mkdir's mode is filtered by the umask and `parents=True` gives the
    parents the umask's default, so each directory fuse creates is chmodded.
    Directories that already exist are left as they are: they are not ours."""
    path = Path(path)
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            if not d.is_dir():
                raise
            continue  # created by someone else meanwhile: not ours to chmod
        os.chmod(d, 0o700)
    return path


def private_file(path: Path) -> None:
    """Create `path` owner-only (0600) if it is missing, and make it 0600 if it
    exists (a file fuse keeps secrets in, made by an older fuse under a looser
    umask, is tightened too)."""
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    os.chmod(path, 0o600)


def private_opener(path: str, flags: int) -> int:
    """An `opener` for `open()` that creates the file owner-only (0600)
    whatever the umask, and tightens one that exists: the agent's state files
    (VM records, events, metering, its identity) are nobody else's to read.
    `open(path, "w", opener=private_opener)`."""
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return fd


def sync_dir(path: Path) -> None:
    """fsync a directory (a file created or renamed in it, on disk), where the file system allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
