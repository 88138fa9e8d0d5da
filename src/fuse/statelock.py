"""One running process per state directory.

A state dir belongs to one process at a time: two host agents on one dir each
boot its VMs (two QEMUs for one VM) and hand out the same event ids; two
controllers on one embedded SQLite store place on the same room twice; two
`fuse up` runs in one dir clean up each other's VMs. The owner holds an
exclusive ``flock`` on ``<dir>/lock`` for as long as it runs. The kernel drops
it when the process ends, however it ends (a crash, SIGKILL), so a dir is never
left locked; the file itself stays behind and means nothing on its own.

The lock's descriptor is close-on-exec (Python's default), so the processes an
owner starts (QEMU, which outlives an agent by design) never inherit it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from .paths import private_dir

LOCK_FILE = "lock"

_held: dict[Path, int] = {}  # dir -> the open lock file's descriptor, kept for the process's life


def hold(state_dir: Path) -> bool:
    """Lock ``state_dir`` (made owner-only if missing) for the rest of this
    process's life: True once held (again True if this process holds it
    already), False when another running process holds it."""
    state_dir = Path(state_dir).absolute()
    if state_dir in _held:
        return True
    private_dir(state_dir)
    fd = lock_file(state_dir / LOCK_FILE)
    if fd is None:
        return False
    _held[state_dir] = fd
    return True


def lock_file(path: Path | str) -> int | None:
    """An exclusive ``flock`` on ``path`` (created owner-only): the open descriptor that
    holds it until closed (or the process ends), or None when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
