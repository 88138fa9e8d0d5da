"""Which database errors a controller answers 503 db_unavailable (it cannot reach its
database: a load balancer takes it out of rotation; or it is busy, a lock waited out) and
which stay 500 internal (a statement failed: a bug to look at, its traceback logged)."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError

from fuse.controller.app import db_unreachable


@pytest.mark.parametrize("exc, unreachable", [
    (OperationalError("SELECT 1", {}, psycopg.OperationalError("connection refused")), True),
    (OperationalError("SELECT 1", {}, psycopg.errors.AdminShutdown("terminating connection")), True),
    (OperationalError("SELECT 1", {}, psycopg.errors.ConnectionFailure("lost")), True),
    (OperationalError("SELECT 1", {}, psycopg.OperationalError("x"), connection_invalidated=True), True),
    (InterfaceError("SELECT 1", {}, psycopg.InterfaceError("the connection is closed")), True),
    (OperationalError("UPDATE", {}, psycopg.errors.DeadlockDetected("deadlock")), False),
    # (a statement that waited out lock_timeout behind another replica's write: the database is
    # busy, and answers; 503 saying so since the thirty-fourth session, handled as an outage is)
    (OperationalError("UPDATE", {}, psycopg.errors.LockNotAvailable("lock timeout")), True),
    (OperationalError("UPDATE", {}, psycopg.errors.QueryCanceled("statement timeout")), False),
    (OperationalError("UPDATE", {}, sqlite3.OperationalError("database is locked")), False),
    (OperationalError("SELECT", {}, sqlite3.OperationalError("no such table: vms")), False),
    (IntegrityError("INSERT", {}, psycopg.errors.UniqueViolation("duplicate key")), False),
])
def test_only_a_database_out_of_reach_is_503(exc, unreachable):
    assert db_unreachable(exc) is unreachable
