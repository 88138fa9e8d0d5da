"""Host pollers: the controller's live view of every host.

A poller per host reads `GET /v1/host` every second and its events with
backoff, one `GET /v1/host/events` of up to 500 a poll: at once when the
summary's `last_event_id` is past the stored cursor (nothing is asked while
it is not), else (an agent that does not report it) after 1 s, doubling to
EVENT_BACKOFF_MAX while the answers are empty; a host that fails backs off
from 1 s to 30 s. Events are stored with the host's own event id
under a unique (host, agent, host_event_id) key, in the same transaction that moves
the host's cursor, so across reconnects and controller restarts no event is
stored twice or skipped. A host that stops answering is marked disconnected
(no placements) and comes back by itself.

One machine may be registered under several names (hosts sharing an agent
identity). Its log is read once, by the first of its names that is connected,
and every read moves the cursor of all its names together: when a name is
deregistered (its cursor row goes with it), or the controller restarts, the
names left carry on from the furthest any of them had read; a name that reads
an agent identity it has no cursor for starts after the newest event the store
holds of that agent (its old names all gone, the machine registered again under
a new one: its log is not delivered a second time). An event of a VM
is tagged with the name the store records the VM under (the one it was created
or moved through), any other with the name that read it.

An agent's log can go back while its identity stays: its files removed (the log and
its ``.next`` both) or restored from an older copy. Its ids then start again below
the cursor. A read whose page says the newest id is below the cursor (``last_id``,
asked of the agent, not the summary a replica's read may have overtaken) finds it so:
the store announces ``host_events_reset`` and keys the agent's events from there
under a new source (``AGENT/EPOCH``, in the cursor and event rows), reading the log from
its start; an event the store holds under an earlier source of the agent (same id,
time and type: the older copy's) is not stored again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, insert, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError

from ..errors import HostUnreachable, NotFound, NotTrusted
from ..tasks import cancel_and_wait
from ..transport import MAX_FACTS_BYTES, BadAddress, HostConnection, transport_kind
from .hosts import ProbedFacts
from .store import events as events_t, host_cursors, hosts as hosts_t, vms as vms_t
from .store.outage import PassLog, db_unreachable

log = logging.getLogger("fuse.controller.fleet")
EVENT_BATCH = 500  # events per poll, at most
EVENT_BACKOFF_MAX = 8.0  # seconds between event reads of an agent that reports no last_event_id, at most
DISCONNECT_AFTER = 2  # failed polls in a row before a host counts as disconnected
POLLERS = "the host pollers"  # (one kind of pass for the outage log: not a line per host)
passes = PassLog(log)


@dataclass
class HostView:
    """What the controller last saw of one host."""
    connected: bool = False
    summary: dict[str, Any] = field(default_factory=dict)
    seen_at: float = 0.0
    error: str = ""
    failures: int = 0  # polls failed in a row
    agent_id: str = ""  # the identity last recorded in the host's row
    url: str = ""  # the address these were seen at
    events_wait: float = 0.0  # seconds until the next event read, when the summary cannot tell
    events_at: float = 0.0  # monotonic time of the next event read, then
    log_checked: bool = False  # whether the agent's log was checked against the store since it answered
    instance: str = ""  # the agent process last seen (a new one: its log is checked again)
    # one poll of the host at a time: a registration's (or a wake's) refresh beside the
    # poller's own could adopt the VM list twice, the later one from a stale read (it
    # dropped a VM recorded in between)
    polling: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False, compare=False)


class Fleet:
    def __init__(self, ctl):
        self.ctl = ctl
        self.store = ctl.store
        self.views: dict[str, HostView] = {}
        self._conns: dict[str, tuple[str, str, HostConnection, tuple | None]] = {}  # url, token+identity, conn, files
        self._tasks: dict[str, asyncio.Task] = {}
        self._sync: asyncio.Task | None = None
        self.changed = asyncio.Event()  # set when events were stored

    # ---- connections ---------------------------------------------------------
    def conn(self, host_id: str) -> HostConnection:
        row = self.store.get_host(host_id)
        if row is None:
            from ..errors import NotFound
            raise NotFound(f"host {host_id} not found")
        cached = self._conns.get(host_id)
        # the controller's identity is part of a mutual-TLS host's connection only: a PUT
        # /v1/controller replaced every host's, and closed the old ones under a move's copy
        try:
            uses_tls = transport_kind(row["url"]) == "tls"
        except BadAddress:
            uses_tls = False  # (HostConnection says what is wrong with it, below)
        if not uses_tls and cached and cached[:2] == (row["url"], row["token"]):
            return cached[2]  # (no settings read: a poll of a host not on mutual TLS needs none)
        # (read each time for a mutual-TLS host, not cached: a PUT through another replica
        # sharing the store is this replica's from its next poll)
        tls = self.ctl.tls_settings()
        key = (row["url"], row["token"] + (repr(tls) if uses_tls else ""))
        # the identity files as they are now: one renewed in place is presented from the next
        # connection (the paths alone kept the old one till a restart)
        stamp = tls.stamp() if uses_tls and tls is not None else None
        if cached and cached[:2] == key and cached[3] == stamp:
            return cached[2]
        try:
            conn = HostConnection(row["url"], row["token"] or None, tls)
        except NotTrusted:
            if cached and cached[:2] == key:
                # the same paths, changed but not loading together yet (a renewal half done: the
                # new certificate beside the old key): the connection made with them goes on
                return cached[2]
            raise
        except BadAddress as exc:  # (stored before addresses were checked: unreachable, with why)
            err = HostUnreachable(f"host {host_id}'s address is not valid: {exc.message}")
            err.maybe_sent = False
            raise err from None
        if cached:  # (its requests under way finish on it first)
            asyncio.ensure_future(cached[2].retire())
        self._conns[host_id] = (*key, conn, stamp)
        return conn

    def live(self, host_id: str) -> dict[str, Any]:
        v = self.views.get(host_id)
        if v is None:
            return {}
        s = v.summary
        return {"connected": v.connected, "free_vcpus": int(s.get("free_vcpus", 0)),
                "free_mem_mib": int(s.get("free_mem_mib", 0)), "memory_pressure": bool(s.get("memory_pressure")),
                "platform": s.get("platform", ""), "bundles": s.get("bundles", []),
                "vm_count": int(s.get("vm_count", 0)), "max_vms": s.get("max_vms")}

    # ---- lifecycle -----------------------------------------------------------
    async def start(self) -> None:
        self._sync = asyncio.create_task(self._sync_loop())
        await self.sync_hosts()

    async def close(self) -> None:
        await cancel_and_wait([*self._tasks.values()] + ([self._sync] if self._sync else []))
        for cached in self._conns.values():
            await cached[2].close()

    async def _sync_loop(self) -> None:
        # Another replica (shared PostgreSQL) may add or remove hosts. A read that
        # fails (the database restarting) is tried again next time: ended, this
        # replica never saw another's hosts again.
        while True:
            await asyncio.sleep(self.ctl.poll_interval)
            try:
                await self.sync_hosts()
                passes.ok("reading the host registry")
            except Exception as exc:
                if isinstance(exc, DBAPIError) and db_unreachable(exc):
                    passes.failed("reading the host registry", exc)
                else:
                    log.warning("could not read the host registry (tried again in %g s): %s",
                                self.ctl.poll_interval, exc)

    async def sync_hosts(self) -> None:
        ids = {r["id"] for r in self.store.list_hosts()}
        for host_id in ids - self._tasks.keys():
            self._tasks[host_id] = asyncio.create_task(self._poll(host_id))
        for host_id in self._tasks.keys() - ids:
            if (task := self._tasks.pop(host_id, None)) is None:
                continue  # (another call of this one, beside it, got there first)
            task.cancel()
            self.views.pop(host_id, None)
            c = self._conns.pop(host_id, None)
            if c:
                await c[2].close()

    async def first_polls(self, ids: list[str], timeout: float) -> None:
        """Wait, at most ``timeout`` seconds, until each host of ``ids`` that has a poller has
        been polled once (answered or not). Right after the controller starts none has, and
        placement would read every host as disconnected: a create sent in its first second
        was 409 fleet_full "host is disconnected" on a fleet that answers. A host of ``ids``
        with no poller yet (registered through another replica since this one last read the
        registry, up to a second ago) gets its poller first, and is waited for too."""
        deadline = time.monotonic() + timeout
        if any(h not in self._tasks for h in ids):
            await self.sync_hosts()

        def unread(h: str) -> bool:
            task, view = self._tasks.get(h), self.views.get(h)
            return task is not None and not task.done() and (view is None or (not view.seen_at and not view.error))
        while any(unread(h) for h in ids) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def poll_now(self, host_id: str) -> None:
        """Poll a host its poller already watches now (no registry read: ``refresh``)."""
        await self._poll_once(host_id)

    async def refresh(self, host_id: str) -> int:
        """Poll a host now (after registration, or when a caller needs fresh
        figures); the events it read."""
        await self.sync_hosts()
        return await self._poll_once(host_id)

    async def read_out(self, host_id: str, first: float, most: float) -> None:
        """Poll a host now (``first`` seconds at most: ``TimeoutError``; or its ``HostUnreachable``),
        then read its events on, a page a poll, until one reads none, one fails or ``most``
        seconds have gone (a deregister: once the host is removed nothing reads them; one page of
        ``EVENT_BATCH`` left the rest of a backlog out of the stream for good)."""
        deadline = time.monotonic() + most
        read = await asyncio.wait_for(self.refresh(host_id), first)
        # (the pages after the first, best effort: the host answered the first, and a caller
        # such as a force deregister takes that answer for the agent's, however a later one fails)
        with contextlib.suppress(HostUnreachable, TimeoutError):
            while read and (left := deadline - time.monotonic()) > 0:
                read = await asyncio.wait_for(self._poll_once(host_id), left)

    # ---- polling -------------------------------------------------------------
    async def _poll(self, host_id: str) -> None:
        backoff, next_events = 0.0, 0.0
        while True:
            try:
                await self._poll_once(host_id, events=time.monotonic() >= next_events)
                backoff = 0.0
                next_events = 0.0
                passes.ok(POLLERS)
            except HostUnreachable:
                backoff = min(max(backoff * 2, self.ctl.poll_interval), 30.0)
                next_events = time.monotonic() + backoff
            except asyncio.CancelledError:
                raise
            except NotFound:
                return  # deregistered (its cancel may have been lost in a wait_for race): the poller ends
            except Exception as exc:  # a bug must not kill the poller
                if isinstance(exc, DBAPIError) and db_unreachable(exc):
                    passes.failed(POLLERS, exc)  # (a line for every host's, not a traceback each)
                else:
                    log.exception("poller for %s", host_id)
            await asyncio.sleep(self.ctl.poll_interval)

    async def _poll_once(self, host_id: str, events: bool = True) -> int:
        """One poll of the host: its summary, and a page of its events (``events``); the
        events read."""
        view = self.views.setdefault(host_id, HostView())
        async with view.polling:
            return await self._poll_locked(host_id, view, events)

    async def _poll_locked(self, host_id: str, view: HostView, events: bool) -> int:
        try:
            conn = self.conn(host_id)
            url = self._conns[host_id][0]
            if view.url != url:
                if view.url:  # registered again at another address: what the old one said is not this one's
                    view.connected, view.summary, view.seen_at, view.error = False, {}, 0.0, ""
                    view.failures, view.agent_id = 0, ""
                view.url = url
            resp = await conn.request("GET", "/v1/host", timeout=5, max_bytes=MAX_FACTS_BYTES)
            if resp.status_code == 401:  # the host_disconnected event and views say why, as vms and usage do
                from .vms import TOKEN_REJECTED
                raise HostUnreachable(TOKEN_REJECTED, code="unauthorized")
            if resp.status_code != 200:
                raise HostUnreachable(f"host answered {resp.status_code}")
            summary = agent_object(resp, SUMMARY)
            if problem := summary_problem(summary):  # (one odd host must not fail every placement:
                # its figures are read as numbers fleet-wide; it reads as out of reach, with why)
                raise HostUnreachable(f"{SUMMARY} is not a fuse agent's: {problem}")
            ident = summary.get("agent_id", "")
            if (inst := summary.get("instance") or "") != view.instance:  # (an agent restarted, perhaps
                view.instance, view.log_checked = inst, False  # unseen: its log may be an older copy)
            # (the first answer a poller gets is no change: the adoption below reads the list)
            new_agent = bool(ident and view.agent_id and ident != view.agent_id)
            other_agent = new_agent
            if ident and ident != view.agent_id:
                # Usage counts a machine once by its agent identity: keep the
                # one the agent answers with now (a wiped state dir gives it a new one).
                row = self.store.get_host(host_id)
                other_agent = bool(row and row.get("agent_id") and row["agent_id"] != ident)
                self.store.set_agent_id(host_id, ident)
            if not view.connected or new_agent:
                # Another agent answers at this address (its state dir wiped, or another
                # one put there), perhaps between two polls: the VMs the old one ran are
                # not there, and its event log (whose ids start over) cannot say so:
                # each is dropped with a ``vm_lost`` event.
                await self._adopt(host_id, conn, lost=other_agent)
            if ident:
                view.agent_id = ident  # (after the list was read: a read that failed is tried again)
            view.summary, view.seen_at, view.error, view.failures = summary, time.time(), "", 0
            if not view.connected:
                view.connected = True
                self._controller_event("host_connected", host_id, {})
            if events:
                return await self._pull_events(host_id, conn, summary.get("agent_id", ""), summary)
            return 0
        except HostUnreachable as exc:
            view.failures += 1
            view.log_checked = False  # (it may come back with its log restored from an older copy)
            # One slow answer on a busy host is not a lost host: two in a row are.
            if (view.connected and view.failures >= DISCONNECT_AFTER) or (not view.connected and not view.error):
                view.connected = False
                self._controller_event("host_disconnected", host_id, {"reason": exc.message})
            view.error = exc.message
            raise

    def _controller_event(self, type_: str, host_id: str, data: dict) -> None:
        if self.store.get_host(host_id) is None:
            return
        if self.store.set_link(host_id, type_ == "host_connected", type_, {"id": host_id, **data}):
            self.changed.set()

    async def _adopt(self, host_id: str, conn: HostConnection, lost: bool = False) -> None:
        """Take in the VMs the host already runs (restarts, leftovers). ``lost``: another
        agent than the one recorded answers there, so the VMs it lacks were lost.

        A stored VM the list lacks is dropped only once the host says it has no such VM: the
        list may be older than the row (a create through this controller or another replica
        that the host made after listing, recorded while the list was on its way), and
        dropping it made a running VM unknown — its delete answered 404, as if gone."""
        resp = await conn.request("GET", "/v1/host/vms")
        if resp.status_code != 200:
            return
        records = agent_object(resp, VM_LIST).get("vms", [])
        if problem := vm_list_problem(records):  # (read field by field below: a KeyError a poll, and
            # the host's VMs never adopted, where it should read as a host out of reach, with why)
            raise HostUnreachable(f"{VM_LIST} is not a fuse agent's: {problem}")
        gone = None
        if not lost:
            listed = {r["name"] for r in records if r.get("state") != "deleted"}
            missing = sorted(self._stored_names(host_id) - listed)
            answers = await asyncio.gather(*(self._has_vm(host_id, conn, n) for n in missing))
            gone = {n for n, there in zip(missing, answers) if there is False}
        if self.upsert_vms(host_id, records, replace=True, lost=lost, gone=gone):
            self.changed.set()

    def _stored_names(self, host_id: str) -> set[str]:
        with self.store.read() as c:
            return set(c.execute(select(vms_t.c.name).where(vms_t.c.host == host_id)).scalars())

    async def _has_vm(self, host_id: str, conn: HostConnection, name: str) -> bool | None:
        """Whether the host has VM ``name`` (None: it did not say)."""
        from .vms import agent_not_found
        try:
            resp = await conn.request("GET", f"/v1/host/vms/{name}", timeout=5)
            if resp.status_code == 404 and agent_not_found(resp):
                return False
            if resp.status_code == 200:
                return resp.json().get("state") != "deleted"
        except Exception as exc:  # (any failure: it stays, and the next adoption asks again)
            log.info("host %s: could not ask for vm %s: %s", host_id, name, exc)
        return None

    def upsert_vms(self, host_id: str, records: list[dict], replace: bool = False, lost: bool = False,
                   gone: set[str] | None = None) -> bool:
        """Record what ``host_id``'s agent says of its VMs. ``replace``: the whole list (a
        poller adopting), so rows it lacks go — of those, only the ``gone`` ones when it is
        given (the host said it has no such VM) — (with ``lost``, each with a ``vm_lost`` event:
        another agent answers there; whether any event was added is returned). A machine registered under several names
        (seed 004 counts it once) lists each VM under one of them: a poller leaves a VM
        another name of the same agent holds where it is; an action through this name
        (a create, a wake, a move's arrival) takes it over."""
        # A copy a move is still bringing in is not the VM yet: the source's is.
        records = [r for r in records if r.get("state") != "incoming" and not (r.get("move_id") and r.get("reserved"))]
        keep = {r["name"] for r in records if r.get("state") != "deleted"}
        added = False
        with self.store.tx() as c:
            known = {r["name"]: r for r in c.execute(select(vms_t).where(vms_t.c.host == host_id)).mappings()}
            agent = c.execute(select(hosts_t.c.agent_id).where(hosts_t.c.id == host_id)).scalar_one_or_none()
            aliases = [h for (h,) in c.execute(select(hosts_t.c.id).where(
                hosts_t.c.agent_id == agent, hosts_t.c.id != host_id))] if agent else []
            # the machine's VMs recorded under its other names: one name reads the machine's
            # log for all of them, so its list updates theirs too (their own pollers read no
            # events while it does: a VM of another name that died stayed running here)
            elsewhere = {n: h for n, h in c.execute(select(vms_t.c.name, vms_t.c.host).where(
                vms_t.c.host.in_(aliases)))} if aliases else {}
            for r in records:
                if r.get("state") == "deleted":
                    continue
                if r["name"] not in known and r["name"] in elsewhere:
                    if replace:  # listed under the machine's other name: it stays there
                        c.execute(update(vms_t).where(vms_t.c.name == r["name"], vms_t.c.host == elsewhere[r["name"]])
                                  .values(vcpus=r["shape"]["vcpus"], mem_mib=r["shape"]["mem_mib"], state=r["state"],
                                          record=r))
                        continue
                    c.execute(vms_t.delete().where(vms_t.c.name == r["name"], vms_t.c.host.in_(aliases)))
                if r.get("move_id") and r["name"] not in known and c.execute(select(vms_t.c.host).where(
                        vms_t.c.name == r["name"], vms_t.c.host != host_id)).first():
                    continue  # a moved VM's source copy, waiting to be removed: the VM lives elsewhere now
                row = dict(vcpus=r["shape"]["vcpus"], mem_mib=r["shape"]["mem_mib"], state=r["state"], record=r)
                if r["name"] in known:
                    c.execute(update(vms_t).where(vms_t.c.host == host_id, vms_t.c.name == r["name"]).values(**row))
                else:
                    c.execute(insert(vms_t).values(name=r["name"], host=host_id, created_at=time.time(), **row))
                    if aliases and not replace:
                        _retag(c, r, host_id, aliases, agent)
            if replace:
                for name in sorted(known.keys() - keep):
                    if known[name]["state"] not in ("moving",) and (gone is None or name in gone):
                        c.execute(vms_t.delete().where(vms_t.c.host == host_id, vms_t.c.name == name))
                        if lost:  # as the pool says of a machine's VMs that went with it
                            self.store.add_event("vm_lost", {
                                "vm": name, "id": host_id, "was": known[name]["state"],
                                "reason": f"another agent answers at host {host_id} (a new agent identity): "
                                          f"it does not have vm {name}"}, host=host_id, conn=c)
                            added = True
        return added

    async def _pull_events(self, host_id: str, conn: HostConnection, agent_id: str, summary: dict) -> int:
        """One read of up to EVENT_BATCH events, when there are new ones (module docstring); how many."""
        # one machine under two names: its events are read once, by the first name that is
        # connected, from where any name got to (module docstring)
        alias = [h for h, v in self.views.items() if agent_id and h != host_id and v.agent_id == agent_id]
        with self.store.read() as c:
            cur = c.execute(select(host_cursors).where(host_cursors.c.host == host_id)).mappings().first()
            # the source the agent's events are keyed under: its identity, or the newest of its
            # logs since one went back (module docstring)
            family = [dict(r) for r in c.execute(select(host_cursors).where(
                host_cursors.c.host.in_([host_id, *alias]), _of_agent(host_cursors.c.agent_id, agent_id)))
                .mappings()] if agent_id else []
            source = max((r["agent_id"] for r in family), key=lambda a: _epoch(a, agent_id), default=None)
            if source is None and agent_id:  # no name has a cursor of it: the source its newest stored
                # event has (a log that went back before, read under a name since deregistered)
                source = c.execute(select(events_t.c.agent_id).where(
                    _of_agent(events_t.c.agent_id, agent_id), events_t.c.host_event_id.is_not(None))
                    .order_by(events_t.c.id.desc()).limit(1)).scalar()
            source = source or agent_id
            shared = max((r["cursor"] for r in family if r["host"] != host_id and r["agent_id"] == source),
                         default=None)
            fresh = bool(agent_id) and (cur is None or cur["agent_id"] != source)
            # An agent this name has no cursor for, whose log the store holds events of: read
            # under a name since deregistered (its cursor went with it). Its ids go on.
            stored = c.execute(select(func.max(events_t.c.host_event_id)).where(
                events_t.c.agent_id == source)).scalar() if fresh else None
        own = cur["cursor"] if cur and cur["agent_id"] == source else 0  # a new agent restarts its ids
        cursor = max(own, shared or 0, stored or 0)
        if cursor > own or fresh:
            # A name that joined after the others had read: it starts where they got to, kept
            # in the store, so that it neither replays the log when they go nor after a restart
            # (and the store's events are looked through once per name and agent, not each poll).
            self._advance(host_id, source, cursor)
        if any(h < host_id and (v := self.views.get(h)) is not None and v.connected for h in alias):
            return 0
        view = self.views.setdefault(host_id, HostView())
        if not view.log_checked and agent_id and cursor > 0:
            # (once each time it answers again: a log restored from an older copy while it was
            # away, that has since passed the cursor, gives the ids read already other events)
            replaced, newest = await self._log_replaced(host_id, conn, agent_id, source, cursor)
            if replaced is not None:
                view.log_checked = True
            if replaced:
                source, cursor = self._log_went_back(host_id, agent_id, cursor, newest), 0
        last = summary.get("last_event_id")
        if isinstance(last, int):
            if last == cursor:
                return 0  # nothing new (a lower id: the agent's log went back, read it)
        elif time.monotonic() < view.events_at:
            return 0
        resp = await conn.request("GET", "/v1/host/events", params={"since": cursor, "limit": EVENT_BATCH})
        if resp.status_code != 200:
            return 0
        page = agent_object(resp, EVENTS)
        top = page.get("last_id")
        if agent_id and isinstance(top, int) and top < cursor:
            source = self._log_went_back(host_id, agent_id, cursor, top)
            cursor = 0
            resp = await conn.request("GET", "/v1/host/events", params={"since": 0, "limit": EVENT_BATCH})
            if resp.status_code != 200:
                return 0
            page = agent_object(resp, EVENTS)
        batch = page.get("events", [])
        if not isinstance(batch, list) or not all(isinstance(e, dict) and isinstance(e.get("id"), int)
                                                  and isinstance(e.get("type"), str) for e in batch):
            raise HostUnreachable(f"{EVENTS} is not a fuse agent's: its events hold an entry that is not an event")
        # (the backoff for an agent whose summary cannot say whether there is news)
        view.events_wait = 0.0 if batch else min(max(2 * view.events_wait, self.ctl.poll_interval), EVENT_BACKOFF_MAX)
        view.events_at = time.monotonic() + view.events_wait
        if not batch:
            return 0
        vm_changed = self._store_events(host_id, agent_id, cursor, batch, source=source)
        self.changed.set()
        if vm_changed:
            await self._adopt(host_id, conn)
        return len(batch)

    async def _log_replaced(self, host_id: str, conn: HostConnection, agent_id: str, source: str,
                            cursor: int) -> tuple[bool | None, int | None]:
        """Whether the agent's log went back below the cursor, or went back and has passed it
        since (its event at the cursor's id is not the one the store holds: same id, another
        event), None when the agent did not say; and its newest id when below the cursor."""
        resp = await conn.request("GET", "/v1/host/events", params={"since": cursor - 1, "limit": 1})
        if resp.status_code != 200:
            return None, None
        page = agent_object(resp, EVENTS)
        if isinstance(page.get("last_id"), int) and page["last_id"] < cursor:
            return True, page["last_id"]
        events = page.get("events") or []
        if not events or events[0].get("id") != cursor or events[0].get("type") == "events_lost":
            return False, None  # (an id its log lost since is given back as events_lost: not another log)
        with self.store.read() as c:
            held = c.execute(select(events_t.c.ts, events_t.c.type).where(
                events_t.c.host.in_(_names(c, host_id, agent_id)), events_t.c.agent_id == source,
                events_t.c.host_event_id == cursor)).first()
        return held is not None and (held[0], held[1]) != (events[0].get("time"), events[0].get("type")), None

    def _log_went_back(self, host_id: str, agent_id: str, cursor: int, top: int | None) -> str:
        """The agent's newest id is below what was read of it: its log was removed or restored
        from an older copy. A new source for its events from here, every name's cursor at 0 under
        it, and an event that says so (module docstring)."""
        source = f"{agent_id}/{time.time_ns() // 1_000_000}"
        log.warning("host %s: its event log went back (newest id %s, read up to %d): reading it again "
                    "from its start", host_id, "past it, other events" if top is None else top, cursor)
        with self.store.tx() as c:
            _set_cursors(c, _names(c, host_id, agent_id), 0, source)
            self.store.add_event("host_events_reset", {"agent_id": agent_id, "read_to": cursor, "newest": top},
                                 host=host_id, conn=c)
        self.changed.set()
        return source

    def _advance(self, host_id: str, agent_id: str, cursor: int) -> None:
        """Raise ``host_id``'s stored cursor to ``cursor`` (never lower it: a read may have
        moved it on meanwhile)."""
        with self.store.tx() as c:
            cur = c.execute(select(host_cursors).where(host_cursors.c.host == host_id)).mappings().first()
            if cur is None:
                c.execute(insert(host_cursors).values(host=host_id, cursor=cursor, agent_id=agent_id))
            elif cur["agent_id"] != agent_id or cur["cursor"] < cursor:
                c.execute(update(host_cursors).where(host_cursors.c.host == host_id)
                          .values(cursor=cursor, agent_id=agent_id))

    def _store_events(self, host_id: str, agent_id: str, cursor: int, batch: list[dict],
                      source: str | None = None) -> bool:
        source = source or agent_id
        vm_changed = False
        with self.store.tx() as c:
            names = _names(c, host_id, agent_id)
            # Stored already, by another replica (under this name or another of the machine: the
            # unique key is per name), so look: an insert the key refused still spent its id on
            # PostgreSQL, and the merged stream's ids had holes (review 28). Under the write lock,
            # what another replica stored is committed and seen here.
            stored = set(c.execute(select(events_t.c.host_event_id).where(
                events_t.c.host.in_(names), events_t.c.agent_id == source,
                events_t.c.host_event_id.in_([e["id"] for e in batch]))).scalars())
            if source != agent_id:  # the older copy's events, stored under an earlier source
                earlier = set(c.execute(select(events_t.c.host_event_id, events_t.c.ts, events_t.c.type).where(
                    events_t.c.host.in_(names), _of_agent(events_t.c.agent_id, agent_id),
                    events_t.c.agent_id != source, events_t.c.host_event_id.in_([e["id"] for e in batch]))).all())
                stored |= {e["id"] for e in batch if (e["id"], e.get("time"), e["type"]) in earlier}
            vms = {e["vm"] for e in batch if isinstance(e.get("vm"), str)}
            owner = _owners(c, vms, names)
            if len(names) > 1:
                owner |= _last_tagged(c, vms - owner.keys(), names)
            if len(names) > 1:
                # a create through another name of the machine that has not had its reply yet: its
                # VM's first events are that name's already, as the store will record it (tagged with
                # the reading name and moved afterwards by ``_retag``, a follower would have seen them
                # under the name that read them: the same event id with two tags)
                vms_service = getattr(self.ctl, "vms", None)
                for h, vm in sorted(vms_service.placing() if vms_service is not None else ()):
                    if vm in vms and vm not in owner and h in names:
                        owner[vm] = h
            for e in batch:
                if e["id"] in stored:
                    continue
                data = {k: v for k, v in e.items() if k not in ("id", "time", "type")}
                try:
                    with c.begin_nested():
                        c.execute(insert(events_t).values(ts=e.get("time", time.time()), type=e["type"],
                                                          host=owner.get(e.get("vm"), host_id), agent_id=source,
                                                          host_event_id=e["id"], data=data))
                except IntegrityError:
                    continue  # stored already (another replica, or a retry)
                vm_changed = vm_changed or "vm" in e
            last = batch[-1]["id"]
            _set_cursors(c, names, last, source)  # every name of the machine has now read this far
        return vm_changed


# What the poller reads, as its reasons name it
SUMMARY, EVENTS = "the host's summary (GET /v1/host)", "the host's events (GET /v1/host/events)"


def agent_object(resp, what: str) -> dict[str, Any]:
    """A host's 200 answer to one of the poller's reads (``what``), read as its agent's JSON
    object; else HostUnreachable saying what it is. A proxy or gateway in the way may answer
    a page of its own, a 200 at that: that is a failed poll, as no answer is (review 36: a
    traceback every poll, and the host held connected on the figures it had last)."""
    try:
        body = resp.json()
    except (ValueError, RecursionError):  # (not JSON, not UTF-8, or nested past reading)
        problem = "it is not JSON"
    else:
        if isinstance(body, dict):
            return body
        problem = f"a JSON {type(body).__name__}, not an object"
    raise HostUnreachable(f"{what} is not a fuse agent's: {problem}")


VM_LIST = "the host's VM list (GET /v1/host/vms)"


def vm_record_problem(vm: Any) -> str | None:
    """What makes ``vm`` no VM record of an agent's (a JSON object with a name, a state and a
    shape of whole vCPUs and MiB), if anything."""
    if not isinstance(vm, dict):
        return f"a JSON {type(vm).__name__}, not an object"
    for key in ("name", "state"):
        if not isinstance(vm.get(key), str) or not vm[key]:
            return f"{key} {vm.get(key)!r} is not a non-empty string"
    shape = vm.get("shape")
    if not isinstance(shape, dict) or not all(type(shape.get(k)) is int for k in ("vcpus", "mem_mib")):
        return f"shape {shape!r} is not whole vcpus and mem_mib"
    return None


def vm_list_problem(records: Any) -> str | None:
    """What makes an agent's ``vms`` list unusable, if anything (its first bad record's fault)."""
    if not isinstance(records, list):
        return f"vms is a JSON {type(records).__name__}, not a list"
    for i, vm in enumerate(records):
        if problem := vm_record_problem(vm):
            return f"vms[{i}]: {problem}"
    return None


SUMMARY_INTS = ("free_vcpus", "free_mem_mib", "vm_count", "last_event_id", "max_vms")
SUMMARY_OPTIONAL = ("last_event_id", "max_vms")  # (may be null or absent)


def summary_problem(summary: Any) -> str | None:
    """What makes an agent's summary unusable (the figures placement reads as numbers, the
    facts registration requires), if anything (review 31: a null or huge figure from one host
    made every create a 500)."""
    if not isinstance(summary, dict):
        return f"a JSON {type(summary).__name__}, not an object"
    for key in SUMMARY_INTS:
        v = summary.get(key)
        if v is None and (key in SUMMARY_OPTIONAL or key not in summary):
            continue
        if isinstance(v, bool) or not isinstance(v, int) or abs(v) >= 2 ** 53:
            return f"{key} is {str(v)[:40]!r}, not a whole number"
    for key, kind in (("agent_id", str), ("platform", str), ("bundles", list), ("features", list)):
        if summary.get(key) is not None and not isinstance(summary[key], kind):
            return f"{key} is not a {'string' if kind is str else 'list'}"
    if any(not isinstance(b, dict) for b in summary.get("bundles") or []):
        return "bundles holds an entry that is not an object"
    try:  # the facts registration requires of an agent (a 200 `{}` read as a host with 0 MiB free)
        ProbedFacts.model_validate(summary)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"it has no valid {where} ({first['msg'][:1].lower() + first['msg'][1:]})"
    return None


def _set_cursors(c: Connection, names: list[str], cursor: int, source: str) -> None:
    """Set the cursor of every name in ``names`` (one machine's) to ``cursor`` under ``source``."""
    for h in names:
        if c.execute(select(host_cursors.c.host).where(host_cursors.c.host == h)).first():
            c.execute(update(host_cursors).where(host_cursors.c.host == h).values(cursor=cursor, agent_id=source))
        else:
            c.execute(insert(host_cursors).values(host=h, cursor=cursor, agent_id=source))


def _of_agent(column, agent_id: str):
    """``column`` (an event source) is the agent's: its identity, or one of its later logs'."""
    return or_(column == agent_id, column.startswith(agent_id + "/", autoescape=True))


def _epoch(source: str, agent_id: str) -> int:
    """Which of an agent's logs ``source`` keys (0: its first; later ones by the time found)."""
    _, _, epoch = source.partition("/")
    return int(epoch) if source.startswith(agent_id + "/") and epoch.isdigit() else 0


def _names(c: Connection, host_id: str, agent_id: str) -> list[str]:
    """Every name the machine that reads as ``host_id`` is registered under, ``host_id`` first."""
    if not agent_id:
        return [host_id]
    return [host_id, *sorted(h for (h,) in c.execute(select(hosts_t.c.id).where(
        hosts_t.c.agent_id == agent_id, hosts_t.c.id != host_id)))]


def _owners(c: Connection, vms: set[str], names: list[str]) -> dict[str, str]:
    """VM name -> the machine's name the store records it under (the first, should
    there be several), for those of ``vms`` it records under one of ``names``."""
    if not vms:
        return {}
    out: dict[str, str] = {}
    for name, host in sorted(c.execute(select(vms_t.c.name, vms_t.c.host).where(
            vms_t.c.name.in_(sorted(vms)), vms_t.c.host.in_(names)))):
        out.setdefault(name, host)
    return out


def _last_tagged(c: Connection, vms: set[str], names: list[str]) -> dict[str, str]:
    """For VMs of a machine under several names that the store no longer lists (deleted
    before their last events were read): the name their newest stored event carries (the
    controller's ``placed``/``vm_removed`` included), so a VM's events keep one name."""
    out: dict[str, str] = {}
    for vm in sorted(vms):
        host = c.execute(select(events_t.c.host).where(
            events_t.c.host.in_(names), events_t.c.data["vm"].as_string() == vm)
            .order_by(events_t.c.id.desc()).limit(1)).scalar()
        if host is not None:
            out[vm] = host
    return out


def _tagged_since(c: Connection, vm: str, names: list[str], since: float) -> str | None:
    """The name (of ``names``, one machine's) that the first stored event of VM ``vm`` from
    ``since`` on carries: the name a VM created then ran under there."""
    return c.execute(select(events_t.c.host).where(
        events_t.c.host.in_(names), events_t.c.data["vm"].as_string() == vm, events_t.c.ts >= since - 0.001)
        .order_by(events_t.c.id).limit(1)).scalar()


def _retag(c: Connection, record: dict, host_id: str, aliases: list[str], agent_id: str) -> None:
    """A VM recorded under ``host_id`` by an action through it (a create, a move's arrival)
    takes its events along: those the machine's log gave before the store knew the VM
    (read in the moment between the agent's first event and the action's reply) were
    tagged with the name that read them. Only those since the VM came to this machine (its
    record's first history entry: its create, or a move's arrival): the events of an earlier
    stay of the VM there, under the other name, were handed out with that name and keep it
    (they were retagged since its creation: a VM moved back through the second name took
    its past there, and that past's usage, along)."""
    try:
        since = datetime.fromisoformat(str(record.get("created_at"))).timestamp() - 0.001
        history = record.get("history") or []
        if history and history[0].get("time"):
            since = max(since, datetime.fromisoformat(str(history[0]["time"])).timestamp() - 0.001)
    except (ValueError, TypeError, AttributeError):
        return
    try:
        with c.begin_nested():
            c.execute(update(events_t).where(
                events_t.c.host.in_(aliases), _of_agent(events_t.c.agent_id, agent_id),
                events_t.c.host_event_id.is_not(None),
                events_t.c.ts >= since, events_t.c.data["vm"].as_string() == record["name"]).values(host=host_id))
    except IntegrityError:
        pass  # stored under both names already (a store from before names shared one cursor): leave it
