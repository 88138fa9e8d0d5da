"""Default socket paths, importable without the heavier transport stack
(`fuse host relay` needs one at every SSH channel it serves)."""

from __future__ import annotations

import os
from pathlib import Path


def default_agent_socket() -> Path:
    """Where `fuse host serve` puts its socket unless told otherwise."""
    if os.geteuid() == 0:
        return Path("/run/fuse-host.sock")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "fuse-host.sock" if runtime else Path(f"/tmp/fuse-{os.getuid()}/fuse-host.sock")


def socket_dir_problem(directory: Path) -> str | None:
    """Why an owner-only socket cannot live in ``directory`` (one line), or None (it is
    missing: it will be made 0700). A directory another user owns, a symbolic link another
    user made, or a directory others may write to (sticky too, as /tmp is: the socket's name
    is known, so they can make it first) lets them put their own socket in the server's place
    and read what clients send it, agent tokens included (``/tmp/fuse-UID`` made first by
    another user, with no ``XDG_RUNTIME_DIR``; or made a link to /tmp)."""
    import stat
    mine = (os.geteuid(), 0)
    try:
        link = os.lstat(directory)
        st = os.stat(directory)  # (followed: a symbolic link to another user's directory is theirs)
    except FileNotFoundError:
        return None if not os.path.islink(directory) else (
            f"the socket's directory {directory} is a symbolic link to nowhere: give --socket elsewhere")
    except OSError as exc:
        return f"the socket's directory {directory}: {exc.strerror or exc}"
    for what, s in (("is a symbolic link that ", link), ("", st)):
        if s.st_uid not in mine:
            return (f"the socket's directory {directory} {what}belongs to another user (uid {s.st_uid}), who "
                    "could put their own socket in its place: give --socket in a directory of your own, or set "
                    "XDG_RUNTIME_DIR")
    if st.st_mode & 0o022:
        return (f"the socket's directory {directory} is writable by others (mode {stat.S_IMODE(st.st_mode):o}), "
                f"who could put their own socket in its place: chmod go-w {directory}, or give --socket in a "
                "directory of your own")
    return None


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
