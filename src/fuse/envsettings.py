"""Seconds an operator may set in the environment (FUSE_SSH_CONNECT_TIMEOUT, the moves'
timeouts, leases): read by one rule, so that a value that is no positive number of
seconds is a one-sentence error when the process starts, not a traceback at import or
a 500 at the first request that reads it."""

from __future__ import annotations

import math
import os


class BadSetting(ValueError):
    """An environment setting that cannot be what it names."""


def seconds(name: str, default: float) -> float:
    """``name``'s value in seconds (``default`` when unset or empty): a positive, finite
    number, else ``BadSetting`` naming the variable and the value."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BadSetting(f"{name}={raw!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise BadSetting(f"{name}={raw!r} must be a positive number of seconds")
    return value


def megabytes(name: str, default: int) -> int:
    """``name``'s value in MiB (``default`` when unset or empty): a positive whole number,
    else ``BadSetting`` naming the variable and the value."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:  # (isdigit alone takes "²", which int refuses)
        raise BadSetting(f"{name}={raw!r} must be a positive whole number of MiB")
    return int(raw)


# Every timing a server reads from its environment (the README lists them), checked
# together where it starts: some are read as their modules load, which would otherwise
# raise before the command could say which one is wrong.
AGENT_TIMINGS = ("FUSE_HTTP_HEAD_TIMEOUT_S", "FUSE_FRESH_PROBE_S")
CONTROLLER_TIMINGS = ("FUSE_SSH_CONNECT_TIMEOUT", "FUSE_MOVE_IO_TIMEOUT", "FUSE_MOVE_QUICK_TIMEOUT",
                      "FUSE_MOVE_LEASE_S", "FUSE_PLACING_LEASE_S", "FUSE_CREATE_UNANSWERED_S",
                      "FUSE_POOL_CREATE_LEASE_S", "FUSE_DRAIN_STANDBY_WAIT_S", "FUSE_HTTP_HEAD_TIMEOUT_S",
                      "FUSE_MOVE_STOP_SETTLE_S", "FUSE_PREWARM_AWAY_S", "FUSE_DRAIN_BOOT_WAIT_S")
AGENT_MEGABYTES = ("FUSE_CONSOLE_MAX_MB",)


def check_seconds(names: tuple[str, ...], mib: tuple[str, ...] = ()) -> None:
    """``BadSetting`` for the first of ``names`` set to anything but a positive number of
    seconds, or of ``mib`` to anything but a positive whole number of MiB."""
    for name in names:
        seconds(name, 1.0)
    for name in mib:
        megabytes(name, 1)
