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
