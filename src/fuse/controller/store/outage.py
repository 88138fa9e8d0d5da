"""Telling the database out of reach from a statement that failed, and saying so once.

A replica whose database is away answers 503 ``db_unavailable`` (``app``), and its
background passes (the host pollers, the move leases, the elastic pool) fail each second
until it is back: one line says so, not a traceback each pass."""

from __future__ import annotations

import logging
import time

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

REMIND_S = 60.0  # while the database stays out of reach, each kind of pass says so again this often


def db_unreachable(exc: DBAPIError) -> bool:
    """Whether ``exc`` says the database could not be reached (503 db_unavailable), rather
    than that a statement failed (a deadlock, a lock, a missing table: 500 internal): a
    connection lost or refused, or PostgreSQL's connection errors (SQLSTATE class 08, a
    server shutting down or starting: 57P01-57P03; a failed connect has no SQLSTATE)."""
    if exc.connection_invalidated or isinstance(exc, InterfaceError):
        return True
    orig = exc.orig
    if isinstance(exc, OperationalError) and type(orig).__module__.split(".")[0] == "psycopg":
        state = getattr(orig, "sqlstate", None)
        return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")
    return False


class PassLog:
    """How a background pass reports a failure. A bug or a statement that failed: its
    traceback, each time. The database out of reach: one line when a kind of pass first
    fails for it, again every ``REMIND_S`` while it stays so, and one when a pass of that
    kind succeeds again (review 32: 344 tracebacks of ``Connection refused`` in a few
    minutes' outage buried everything else in the log)."""

    def __init__(self, log: logging.Logger):
        self.log = log
        self._away: dict[str, tuple[float, int]] = {}  # kind -> (when it was last said, passes failed since)

    def failed(self, kind: str, exc: BaseException) -> None:
        if not (isinstance(exc, DBAPIError) and db_unreachable(exc)):
            self.log.error("%s", kind, exc_info=exc)
            return
        now = time.monotonic()
        said, failed = self._away.get(kind, (0.0, 0))
        why = " ".join(str(exc.orig or exc).split())
        if not said:
            self.log.warning("%s: the database is out of reach (%s); said again every %g s while it stays so",
                             kind, why, REMIND_S)
        elif now - said >= REMIND_S:
            self.log.warning("%s: the database is still out of reach (%d passes failed in %.0f s): %s",
                             kind, failed + 1, now - said, why)
        else:
            self._away[kind] = (said, failed + 1)
            return
        self._away[kind] = (now, 0)

    def ok(self, kind: str) -> None:
        if self._away.pop(kind, None) is not None:
            self.log.warning("%s: the database answers again", kind)
