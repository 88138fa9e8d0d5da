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
    than that a statement failed (a deadlock, a missing table: 500 internal): a
    connection lost or refused, or PostgreSQL's connection errors (SQLSTATE class 08, a
    server shutting down or starting: 57P01-57P03; a failed connect has no SQLSTATE), or
    a statement that waited out ``lock_timeout`` (``db_busy``): what comes back by itself,
    so it is handled as an outage is (503, the host's work recorded once it is back)."""
    if exc.connection_invalidated or isinstance(exc, InterfaceError):
        return True
    orig = exc.orig
    if isinstance(exc, OperationalError) and type(orig).__module__.split(".")[0] == "psycopg":
        state = getattr(orig, "sqlstate", None)
        return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03", LOCK_NOT_AVAILABLE)
    return False


LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE for a statement that waited out lock_timeout


def db_busy(exc: DBAPIError) -> bool:
    """Whether ``exc`` is a statement that waited out ``lock_timeout`` behind another
    transaction (another replica's write): the database answers, it is busy."""
    return getattr(exc.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE


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
        away = "busy (another transaction holds a lock it waited for)" if db_busy(exc) else "out of reach"
        if not said:
            self.log.warning("%s: the database is %s (%s); said again every %g s while it stays so",
                             kind, away, why, REMIND_S)
        elif now - said >= REMIND_S:
            self.log.warning("%s: the database is still %s (%d passes failed in %.0f s): %s",
                             kind, away, failed + 1, now - said, why)
        else:
            self._away[kind] = (said, failed + 1)
            return
        self._away[kind] = (now, 0)

    def ok(self, kind: str) -> None:
        if self._away.pop(kind, None) is not None:
            self.log.warning("%s: the database answers again", kind)
