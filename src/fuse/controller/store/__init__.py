"""The controller's store: SQLite by default (zero set-up), PostgreSQL for
several replicas sharing one fleet. SQLAlchemy Core keeps one code path for
both; every write is one transaction."""

from __future__ import annotations

import hashlib
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from sqlalchemy import (JSON, BigInteger, Column, Float, Integer, MetaData, String, Table, Text,
                        UniqueConstraint, and_, create_engine, delete, event, func, insert, or_, select, text,
                        update)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError

from ...agent.admission import HOLDS_MEMORY
from ...paths import private_file

metadata = MetaData()
WRITE_LOCK_KEY = 0x66757365  # "fuse": the PostgreSQL advisory lock of write transactions
UNANSWERED = "unanswered:"  # the settings keys of creates a host did not answer (Store.add_unanswered)

hosts = Table(
    "hosts", metadata,
    Column("id", String(255), primary_key=True),
    Column("url", Text, nullable=False),
    Column("token", Text, nullable=False, default=""),  # never returned by any API
    Column("region", String(255), nullable=False, default=""),
    Column("backend", String(32), nullable=False),
    Column("labels", JSON, nullable=False, default=dict),
    Column("capacity", JSON, nullable=False),
    Column("state", String(16), nullable=False),
    Column("agent_id", String(64), nullable=False, default=""),
    Column("last_seen", Float, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

vms = Table(
    "vms", metadata,
    Column("name", String(255), primary_key=True),
    Column("host", String(255), primary_key=True, index=True),
    Column("vcpus", Integer, nullable=False),
    Column("mem_mib", Integer, nullable=False),
    Column("state", String(32), nullable=False),
    Column("record", JSON, nullable=False, default=dict),
    Column("created_at", Float, nullable=False),
)

events = Table(
    "events", metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("ts", Float, nullable=False),
    Column("type", String(64), nullable=False),
    Column("host", String(255), nullable=False, default=""),
    Column("agent_id", String(64), nullable=False, default=""),
    Column("host_event_id", BigInteger, nullable=True),
    Column("data", JSON, nullable=False, default=dict),
    UniqueConstraint("host", "agent_id", "host_event_id", name="uq_events_host_event"),
)

# How far the controller has read each host's own event log.
host_cursors = Table(
    "host_cursors", metadata,
    Column("host", String(255), primary_key=True),
    Column("agent_id", String(64), nullable=False, default=""),
    Column("cursor", BigInteger, nullable=False, default=0),
)

settings = Table(
    "settings", metadata,
    Column("key", String(64), primary_key=True),
    Column("value", JSON, nullable=False),
)

moves = Table(
    "moves", metadata,
    Column("id", String(64), primary_key=True),
    Column("vm", String(255), nullable=False, index=True),
    Column("source", String(255), nullable=False),
    Column("target", String(255), nullable=False),
    Column("state", String(16), nullable=False),
    Column("record", JSON, nullable=False, default=dict),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

# Room a create or a wake holds on a host while it waits on the host's answer, written by
# the replicas sharing a PostgreSQL store so that each counts what the others are placing
# (one controller on SQLite keeps its own in memory, ``VmService``). A row lives until its
# create or wake is answered; ``expires`` is renewed while it waits, so the rows of a
# replica that died go by themselves.
placing = Table(
    "placing", metadata,
    Column("id", String(64), primary_key=True),
    Column("replica", String(64), nullable=False),
    Column("host", String(255), nullable=False, index=True),
    Column("name", String(255), nullable=False),
    Column("kind", String(8), nullable=False),  # create | wake
    Column("vcpus", Integer, nullable=False),
    Column("mem_mib", Integer, nullable=False),
    Column("expires", Float, nullable=False),
)

# The states of a move that is not over (the state machine is moves.py's); "pending"
# is the name a store written by an earlier version has for "starting".
ACTIVE_MOVES = ("starting", "pending", "sleeping", "copying", "waking", "rolling_back")


# The elastic pool (seed 001): linked clouds, the machines added in them, prewarms.
clouds = Table(
    "clouds", metadata,
    Column("name", String(64), primary_key=True),
    Column("kind", String(32), nullable=False),
    Column("options", JSON, nullable=False, default=dict),  # secrets included: never returned
    Column("created_at", Float, nullable=False),
)

elastic_hosts = Table(
    "elastic_hosts", metadata,
    Column("name", String(255), primary_key=True),
    Column("provider", String(64), nullable=False),
    Column("type_name", String(64), nullable=False),
    Column("region", String(64), nullable=False),
    Column("cloud_id", String(255), nullable=False, default=""),
    Column("state", String(16), nullable=False),
    Column("started", Float, nullable=False),
    Column("ended", Float, nullable=True),
    Column("expires", BigInteger, nullable=False, default=0),
    Column("usd_per_hour", Float, nullable=False),
    Column("billing_step_secs", Integer, nullable=False),
    Column("billing_min_secs", Integer, nullable=False),
    Column("boot_secs", Integer, nullable=False, default=0),
    Column("pinned", Integer, nullable=False, default=0),
    Column("token", Text, nullable=False, default=""),  # the agent's token: never returned
    Column("record", JSON, nullable=False, default=dict),  # history, last error, url
    Column("updated_at", Float, nullable=False),
)

prewarms = Table(
    "prewarms", metadata,
    Column("id", String(32), primary_key=True),
    Column("record", JSON, nullable=False),
    Column("created_at", Float, nullable=False),
)


def engine_url(db: str | None, state_dir: Path) -> str:
    if not db:
        return f"sqlite:///{state_dir / 'fuse.db'}"
    if db.startswith("postgresql://") or db.startswith("postgres://"):
        return "postgresql+psycopg://" + db.split("://", 1)[1]
    return db


def _private_sqlite_files(url: str) -> None:
    """The database holds agent tokens: born 0600 (SQLite gives its -wal and -shm
    files the database file's mode), and tightened if an older fuse left it looser."""
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    for suffix in ("", "-wal", "-shm"):
        path = Path(database + suffix)
        if suffix == "" or path.exists():
            private_file(path)


class Store:
    def __init__(self, url: str):
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        kwargs: dict[str, Any] = {"future": True}
        if self.is_sqlite:
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        else:
            # (a server that does not answer a connection is an error within 4 s, not a hang: most
            # calls wait on the event loop, and the health check answers within 5 s; a statement
            # unanswered is cut by ``_Watchdog``)
            # A statement waiting on a lock (another replica's write transaction holds the write
            # lock) ends at ``DB_LOCK_TIMEOUT_S`` with PostgreSQL's own error, before the watchdog
            # would take the database for out of reach (review 33: 503 "cannot reach its
            # database" while it answered, and every call failed until its probe did)
            # (set on each new connection, not as the startup ``options``: those would replace an
            # operator's own, a search_path given in the url or PGOPTIONS)
            kwargs.update(pool_pre_ping=True, pool_size=5, max_overflow=10, connect_args={"connect_timeout": 4})
        if self.is_sqlite:
            _private_sqlite_files(url)
        self.engine: Engine = create_engine(url, **kwargs)
        self._watch = None if self.is_sqlite else _Watchdog(self.engine, url)
        if not self.is_sqlite:
            @event.listens_for(self.engine, "connect")
            def _lock_timeout(dbapi_conn, _):
                autocommit = dbapi_conn.autocommit
                dbapi_conn.autocommit = True  # (a session setting, outside any transaction)
                try:
                    dbapi_conn.execute(f"SET lock_timeout = {int(DB_LOCK_TIMEOUT_S * 1000)}")
                    # a replica stopped inside a write transaction (SIGSTOP, its VM paused, its
                    # network gone without a FIN) held the write lock, so every replica's writes
                    # failed busy until it ran again (hours, for a partition: TCP keep-alive):
                    # PostgreSQL ends such a session and its transaction, and the others go on
                    dbapi_conn.execute(
                        f"SET idle_in_transaction_session_timeout = {int(DB_IDLE_TX_TIMEOUT_S * 1000)}")
                finally:
                    dbapi_conn.autocommit = autocommit
        if self.is_sqlite:
            @event.listens_for(self.engine, "connect")
            def _pragmas(dbapi_conn, _):
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
                cur.close()
        # SQLite allows one writer; serialise writes in-process rather than
        # collecting "database is locked" errors under concurrent creates.
        self._write_lock = threading.Lock() if self.is_sqlite else None
        self._create_schema()

    def _create_schema(self) -> None:
        """Create the tables a new database lacks. On PostgreSQL, replicas started together
        on an empty database would each see no table and each create it, and all but one
        fail on PostgreSQL's catalog (a duplicate ``pg_type`` row): the creation is one
        transaction behind the write lock, so the second replica waits, then finds the
        tables there (each statement of the transaction reads what has committed)."""
        if self.is_sqlite:
            metadata.create_all(self.engine)
            return
        with self.engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": WRITE_LOCK_KEY})
            metadata.create_all(conn)

    @contextmanager
    def tx(self) -> Iterator[Connection]:
        """One write transaction. Writes are serialised, as SQLite does by itself: in
        this process by a lock, across PostgreSQL replicas by a transaction-scoped
        advisory lock taken first. So event ids commit in the order they are drawn, and
        a reader following the merged stream by id (``events_after``) never passes an
        id that a slower transaction commits later."""
        if self._write_lock is None:
            self._reachable()
            with self.engine.begin() as conn:
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": WRITE_LOCK_KEY})
                yield conn
            return
        with self._write_lock, self.engine.begin() as conn:
            yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        self._reachable()
        with self.engine.connect() as conn:
            yield conn

    def _reachable(self) -> None:
        """The driver's OperationalError at once while the watchdog holds the database for
        out of reach (a statement it left unanswered ``DB_OP_TIMEOUT_S``, or a connect refused or
        timed out, and no answer to its probe since): each call would otherwise wait its own 10 s, most of them on the
        event loop, and no route (the health check included) would answer meanwhile."""
        if self._watch is not None and self._watch.down.is_set():
            import psycopg
            from sqlalchemy.exc import OperationalError
            raise OperationalError("(checkout)", None, psycopg.OperationalError(self._watch.why))

    def close(self) -> None:
        if self._watch is not None:
            self._watch.stop.set()
        self.engine.dispose()

    def damage(self) -> str | None:
        """What SQLite's ``PRAGMA quick_check`` finds wrong with the file (its first lines), or
        None: sound, or not SQLite. Opening reads only the first pages: a file damaged past
        them was served, with some routes answering 500 and every loop pass a traceback."""
        if not self.is_sqlite:
            return None
        try:
            with self.engine.connect() as conn:
                rows = [str(r[0]) for r in conn.execute(text("PRAGMA quick_check(3)"))]
        except DBAPIError as exc:  # ("database disk image is malformed" before it can say more)
            return " ".join(str(exc.orig or exc).split())
        if rows == ["ok"]:
            return None
        lines = [line.strip() for r in rows for line in r.splitlines()]
        return "; ".join([line for line in lines if line and not line.startswith("*** in database")][:3])

    def ping(self) -> None:
        """Raise unless the database answers a query (the health check's)."""
        with self.read() as c:
            c.execute(text("SELECT 1"))

    # ---- hosts -------------------------------------------------------------
    def get_host(self, host_id: str, conn: Connection | None = None) -> dict | None:
        q = select(hosts).where(hosts.c.id == host_id)
        if conn is not None:
            row = conn.execute(q).mappings().first()
        else:
            with self.read() as c:
                row = c.execute(q).mappings().first()
        return dict(row) if row else None

    def list_hosts(self) -> list[dict]:
        with self.read() as c:
            return [dict(r) for r in c.execute(select(hosts).order_by(hosts.c.id)).mappings()]

    def put_host(self, conn: Connection, row: dict) -> None:
        if self.get_host(row["id"], conn) is None:
            conn.execute(insert(hosts).values(**row))
        else:
            conn.execute(update(hosts).where(hosts.c.id == row["id"]).values(**row))

    def set_host_state(self, host_id: str, state: str) -> bool:
        with self.tx() as c:
            n = c.execute(update(hosts).where(hosts.c.id == host_id)
                          .values(state=state, updated_at=time.time())).rowcount
        return n > 0

    def set_agent_id(self, host_id: str, agent_id: str) -> bool:
        """Record the identity the host's agent now answers with (a wiped
        state dir gives an agent a new one); False when it was already so.
        Read first: every poller calls this on its first poll, and a write
        would queue behind every other writer."""
        row = self.get_host(host_id)
        if row is None or row["agent_id"] == agent_id:
            return False
        with self.tx() as c:
            n = c.execute(update(hosts).where(hosts.c.id == host_id, hosts.c.agent_id != agent_id)
                          .values(agent_id=agent_id, updated_at=time.time())).rowcount
        return n > 0

    def delete_host(self, conn: Connection, host_id: str) -> None:
        conn.execute(delete(hosts).where(hosts.c.id == host_id))
        conn.execute(delete(host_cursors).where(host_cursors.c.host == host_id))
        conn.execute(delete(settings).where(settings.c.key == "link:" + hashlib.sha1(host_id.encode()).hexdigest()))
        for u in self.unanswered(conn):  # (nothing can land on a host that is no more)
            if u["host"] == host_id:
                self.drop_unanswered(host_id, u["name"], conn)

    # ---- creates a host did not answer --------------------------------------
    # (kept here, not only in the controller's memory: a restart, and every replica, must
    # still hold the VM's name until the host says whether it landed, or the name is
    # placed again elsewhere and the VM runs twice once the host comes back)
    @staticmethod
    def _unanswered_key(host: str, name: str) -> str:
        return UNANSWERED + hashlib.sha1(f"{host}\0{name}".encode()).hexdigest()

    def add_unanswered(self, host: str, name: str, vcpus: int, mem_mib: int, since: float) -> None:
        self.put_setting(self._unanswered_key(host, name),
                         {"host": host, "name": name, "vcpus": vcpus, "mem_mib": mem_mib, "since": since})

    def unanswered(self, conn: Connection | None = None) -> list[dict]:
        """Every create a host did not answer whose VM it has not said it has or lacks."""
        q = select(settings.c.value).where(settings.c.key.like(UNANSWERED + "%"))
        if conn is not None:
            return [dict(v) for v in conn.execute(q).scalars()]
        with self.read() as c:
            return [dict(v) for v in c.execute(q).scalars()]

    def has_unanswered(self, host: str, name: str) -> bool:
        return self.get_setting(self._unanswered_key(host, name)) is not None

    def claim_unanswered(self, host: str, name: str, row: dict) -> dict | None:
        """Take over the record of the create of vm ``name`` sent to ``host`` when no replica
        holds it: still recorded, and no live ``placing`` row of a create of it (its replica
        died, its lease ran out). Checked and ``row`` (the claimer's placing row for it) written
        in one write transaction, the replicas' write lock: of two replicas claiming it at once,
        the second finds the first's row. The record (None: settled meanwhile, or held)."""
        with self.tx() as c:
            rec = self.get_setting(self._unanswered_key(host, name), conn=c)
            held = c.execute(select(placing.c.id).where(
                placing.c.host == host, placing.c.name == name, placing.c.kind == "create",
                placing.c.expires > time.time()).limit(1)).first()
            if rec is None or held is not None:
                return None
            self.add_placing(c, row)
            return dict(rec)

    def drop_unanswered(self, host: str, name: str, conn: Connection | None = None) -> bool:
        """Remove it; whether it was there (one remover wins: it alone reports the VM)."""
        if conn is None:
            with self.tx() as c:
                return self.drop_unanswered(host, name, c)
        return conn.execute(delete(settings).where(settings.c.key == self._unanswered_key(host, name))).rowcount > 0

    # ---- vms ---------------------------------------------------------------
    def vms_on(self, host_id: str, conn: Connection | None = None) -> list[dict]:
        q = select(vms).where(vms.c.host == host_id).order_by(vms.c.name)
        if conn is not None:
            return [dict(r) for r in conn.execute(q).mappings()]
        with self.read() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    def list_vms(self) -> list[dict]:
        with self.read() as c:
            return [dict(r) for r in c.execute(select(vms).order_by(vms.c.name)).mappings()]

    def vms_named(self, name: str) -> list[dict]:
        with self.read() as c:
            return [dict(r) for r in c.execute(select(vms).where(vms.c.name == name)).mappings()]

    def allocated(self) -> dict[str, dict[str, int]]:
        """Per host: the VMs that hold room there and their summed shape.

        The host agent's own rule (`HOLDS_MEMORY`): a creating or running VM
        holds its memory; a sleeping one gave it back (seed 002: deallocate
        releases the compute resources), unless its room stays reserved: the
        source copy of a running VM's move keeps `return_room` so a failed
        move can always wake it home, and a copy that arrived by a move keeps
        `reserved` until the wake completing it. Exited and failed VMs hold
        nothing. Counting only these keeps placement's `capacity − allocated`
        in step with what the host would admit.

        A move's VM also holds its room on the target (`move_reservations`)
        until the move ends: then it is the VM's row there (done), or nothing
        (failed)."""
        holds = or_(vms.c.state.in_(sorted(HOLDS_MEMORY)),
                    and_(vms.c.state == "sleeping",
                         or_(vms.c.record["return_room"].as_boolean(), vms.c.record["reserved"].as_boolean())))
        q = (select(vms.c.host, func.count(), func.coalesce(func.sum(vms.c.vcpus), 0),
                    func.coalesce(func.sum(vms.c.mem_mib), 0)).where(holds).group_by(vms.c.host))
        with self.read() as c:
            out = {h: {"vm_count": n, "cpus": int(cpu), "ram_mb": int(mem)} for h, n, cpu, mem in c.execute(q)}
            for m in self.move_reservations(c):
                a = out.setdefault(m["target"], {"vm_count": 0, "cpus": 0, "ram_mb": 0})
                a["vm_count"] += 1
                a["cpus"] += m["vcpus"]
                a["ram_mb"] += m["mem_mib"]
        return out

    def move_reservations(self, conn: Connection) -> list[dict]:
        """The room moves under way hold on their targets: one entry (move, vm,
        target, vcpus, mem_mib) per move between the choice of its target and
        its end. Seed 004 has the target reserve the room from `copying` on;
        the controller counts it from the moment it chose the target, so that
        no create, wake or other move takes the room it promised the move in
        the meantime (the target's own admission judges by its hardware, not
        by the declared capacity the controller keeps to). Not counted: a move
        rolling back once the target's side is aborted (`target_clear`), and
        a move whose VM already has its row on the target (woken there, the
        move finishing): that row holds the room."""
        out = []
        rows = conn.execute(select(moves.c.id, moves.c.vm, moves.c.target, moves.c.record)
                            .where(moves.c.state.in_(ACTIVE_MOVES))).mappings().all()
        for m in rows:
            rec = m["record"] or {}
            shape = (rec.get("vm") or {}).get("shape") or {}
            if rec.get("target_clear") or not shape:
                continue
            if conn.execute(select(vms.c.name).where(vms.c.host == m["target"], vms.c.name == m["vm"])).first():
                continue
            out.append({"move": m["id"], "vm": m["vm"], "target": m["target"],
                        "vcpus": int(shape.get("vcpus", 0)), "mem_mib": int(shape.get("mem_mib", 0))})
        return out

    # ---- room being placed, across replicas ----------------------------------
    def add_placing(self, conn: Connection, row: dict) -> None:
        conn.execute(insert(placing).values(**row))

    def drop_placing(self, ids: list[str]) -> None:
        with self.tx() as c:
            c.execute(delete(placing).where(placing.c.id.in_(ids)))

    def renew_placing(self, ids: list[str], expires: float) -> None:
        with self.tx() as c:
            c.execute(update(placing).where(placing.c.id.in_(ids)).values(expires=expires))
            c.execute(delete(placing).where(placing.c.expires < time.time()))  # (a dead replica's)

    def placing_of_others(self, replica: str, conn: Connection | None = None) -> list[dict]:
        """The rows other replicas hold and have not let expire."""
        q = select(placing).where(placing.c.replica != replica, placing.c.expires > time.time())
        if conn is not None:
            return [dict(r) for r in conn.execute(q).mappings()]
        with self.read() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    # ---- events ------------------------------------------------------------
    def add_event(self, type_: str, data: dict, host: str = "", host_event_id: int | None = None,
                  ts: float | None = None, conn: Connection | None = None) -> None:
        row = dict(ts=ts or time.time(), type=type_, host=host, host_event_id=host_event_id, data=data)
        if conn is not None:
            conn.execute(insert(events).values(**row))
        else:
            with self.tx() as c:
                c.execute(insert(events).values(**row))

    def events_after(self, cursor: int, limit: int = 500) -> list[dict]:
        q = select(events).where(events.c.id > cursor).order_by(events.c.id).limit(limit)
        with self.read() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    def events_of(self, type_: str, limit: int) -> list[dict]:
        """The data of the newest ``limit`` events of ``type_``, newest first."""
        q = select(events.c.data).where(events.c.type == type_).order_by(events.c.id.desc()).limit(limit)
        with self.read() as c:
            return [dict(r) for r in c.execute(q).scalars()]

    def last_event_id(self) -> int:
        with self.read() as c:
            return int(c.execute(select(func.coalesce(func.max(events.c.id), 0))).scalar_one())

    def set_link(self, host: str, up: bool, type_: str, data: dict) -> bool:
        """Record whether ``host`` answers, shared by every controller replica
        on this store, and add ``type_`` to the events only when that changed:
        replicas polling the same host report each connect and disconnect
        once, not once each."""
        key = "link:" + hashlib.sha1(host.encode()).hexdigest()
        try:
            with self.tx() as c:
                was = c.execute(select(settings.c.value).where(settings.c.key == key).with_for_update()).first()
                if was is not None and was[0] == up:
                    return False
                if was is None:
                    c.execute(insert(settings).values(key=key, value=up))
                else:
                    c.execute(update(settings).where(settings.c.key == key).values(value=up))
                self.add_event(type_, data, host=host, conn=c)
                return True
        except IntegrityError:  # another replica recorded it first
            return False

    # ---- settings ----------------------------------------------------------
    def get_setting(self, key: str, default: Any = None, conn: Connection | None = None) -> Any:
        q = select(settings.c.value).where(settings.c.key == key)
        if conn is not None:
            v = conn.execute(q).scalar_one_or_none()
        else:
            with self.read() as c:
                v = c.execute(q).scalar_one_or_none()
        return default if v is None else v

    def put_setting(self, key: str, value: Any, conn: Connection | None = None) -> None:
        """Write a setting, in ``conn``'s transaction when given, else in one of its own."""
        if conn is None:
            with self.tx() as c:
                return self.put_setting(key, value, c)
        if conn.execute(select(settings.c.key).where(settings.c.key == key)).first():
            conn.execute(update(settings).where(settings.c.key == key).values(value=value))
        else:
            conn.execute(insert(settings).values(key=key, value=value))



DB_OP_TIMEOUT_S = 4.5  # a statement PostgreSQL has not answered this long: its connection is cut (the
# health check answers within 5 s)
NOT_ANSWERING = f"the database did not answer within {DB_OP_TIMEOUT_S:g} s (not tried again until it answers)"
DB_LOCK_TIMEOUT_S = 3.5  # a statement waiting on a lock this long fails (busy), well under DB_OP_TIMEOUT_S
DB_IDLE_TX_TIMEOUT_S = 10.0  # a transaction this long without a statement (its replica stopped): PostgreSQL
# ends its session, which frees the write lock (a transaction's statements come back to back: no await
# between them)
DB_PROBE_TIMEOUT_S = 3.0  # the watchdog's own question while the database is held out of reach
STALL_S = 1.0  # the watchdog's looks this far apart: this process did not run meanwhile (its statements' clocks restart)


class _Watchdog:
    """Bounds every statement on PostgreSQL: a server that stopped answering (frozen, a
    partition: its TCP still acknowledged, so nothing times out by itself) left each call
    waiting for good, the event loop's included, so no route answered, not even the
    health check (review 28: > 180 s). A thread looks at every connection of the pool
    four times a second; one busy on a statement (libpq's ACTIVE) for ``DB_OP_TIMEOUT_S`` has
    its socket shut down, which ends the call with the driver's OperationalError (503
    ``db_unavailable``), and the database is held out of reach (``down``: calls fail at
    once, ``Store._reachable``) until a probe of its own, on a connection of its own,
    is answered within ``DB_PROBE_TIMEOUT_S``. So is a connect of the pool's that is refused
    or times out (``connect_timeout``): a frozen postmaster, or a partition dropping SYNs,
    answers no new connection, and each call waited out its own connect."""

    def __init__(self, engine: Engine, url: str):
        import weakref

        self.url = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self.conns: weakref.WeakSet = weakref.WeakSet()
        self.busy: dict[int, float] = {}  # id(connection) -> when it was first seen busy
        self.began: dict[int, float] = {}  # id(connection) -> when its latest statement was sent
        self.looked = time.monotonic()  # when ``_look`` last ran
        self.down, self.stop = threading.Event(), threading.Event()
        self.why = NOT_ANSWERING  # what calls fail with while ``down``
        self._lock = threading.Lock()

        @event.listens_for(engine, "connect")
        def _track(dbapi_conn, _):
            with self._lock:
                self.conns.add(dbapi_conn)

        @event.listens_for(engine, "before_cursor_execute")
        def _began(conn, cursor, statement, parameters, context, executemany):
            # (a connection busy on one statement after another, never seen idle between two
            # looks, is timed from its latest statement, not from the first look)
            self.began[id(conn.connection.dbapi_connection)] = time.monotonic()

        @event.listens_for(engine, "do_connect")
        def _connect(dialect, record, cargs, cparams):
            # (a statement cut is retried on a new connection by the pool: while the database
            # is out of reach that is the driver's error at once, not a connect's 4 s wait)
            import psycopg

            if self.down.is_set():
                raise psycopg.OperationalError(self.why)
            try:
                return dialect.connect(*cargs, **cparams)
            except psycopg.OperationalError as exc:
                # a connect refused or timed out holds the database out of reach too (review 32:
                # a frozen postmaster, its SYNs queued, had each call on the event loop wait its
                # own 4 s connect, and no route answered for a minute); the probe lets it back
                self.why = f"the database could not be reached ({' '.join(str(exc).split())[:200]}); " \
                           "not tried again until it answers"
                self.down.set()
                raise

        threading.Thread(target=self._run, name="fuse-db-watchdog", daemon=True).start()

    def _run(self) -> None:
        while not self.stop.wait(0.25):
            try:
                self._look()
            except Exception:  # (a connection closing while looked at: the next look)
                pass

    def _look(self) -> None:
        now = time.monotonic()
        if now - self.looked >= STALL_S:
            # this process did not run (SIGSTOP, its VM paused, a starved machine): an answer that
            # came meanwhile sits unread in its socket, so a statement's time is counted again from
            # now (the CI run of the thirty-fifth session: a replica frozen with a statement out had
            # its connection cut as it resumed, and its drain's caller got 503 db_unavailable)
            self.busy.clear()
            self.began.clear()
        try:
            self._judge(now)
        finally:
            # (when this look ended: its own probe of a frozen server takes seconds, which is no
            # stall of this process — counted from its start, every look after a cut would reset
            # the timers, and a younger statement would never be cut: the diff review)
            self.looked = time.monotonic()

    def _judge(self, now: float) -> None:
        from psycopg import pq

        with self._lock:
            conns = list(self.conns)
        seen = set()
        for c in conns:
            if c.closed or c.pgconn.transaction_status != pq.TransactionStatus.ACTIVE:
                continue
            seen.add(id(c))
            since = max(self.busy.setdefault(id(c), now), self.began.get(id(c), 0.0))
            if now - since >= DB_OP_TIMEOUT_S:
                self.why = NOT_ANSWERING
                self.down.set()
                _cut(c.pgconn.socket)
        self.busy = {k: v for k, v in self.busy.items() if k in seen}
        live = {id(c) for c in conns}
        for k in self.began.copy().keys() - live:  # (written by other threads meanwhile: a copy, then pops)
            self.began.pop(k, None)
        if self.down.is_set() and self._answers():
            self.down.clear()

    def _answers(self) -> bool:
        """A fresh connection's ``SELECT 1`` answered within ``DB_PROBE_TIMEOUT_S`` (in a
        thread of its own, whose socket is cut when it is not)."""
        import psycopg

        got: dict[str, Any] = {}

        def probe():
            try:
                with psycopg.connect(self.url, connect_timeout=max(2, int(DB_PROBE_TIMEOUT_S))) as c:
                    got["conn"] = c
                    c.execute("SELECT 1")
                    got["ok"] = True
            except Exception:
                pass

        t = threading.Thread(target=probe, daemon=True)
        t.start()
        t.join(DB_PROBE_TIMEOUT_S)
        if t.is_alive() and "conn" in got:
            _cut(got["conn"].pgconn.socket)
        return bool(got.get("ok"))


def _cut(fd: int) -> None:
    """Shut down the socket ``fd`` (both ways): a call blocked on it returns with an error."""
    import os
    import socket

    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        s.close()
