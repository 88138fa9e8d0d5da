"""Where a move goes: the target host, checked or chosen by best fit.

A named target (``to``) is checked in full before the VM is touched (registered,
another machine, active, no VM of the name, connected, no leftover copy, the
same platform, bundle and Firecracker release, and room by the same filter
placement uses), so a refusal comes with its reason while the VM still runs.
Without one, the best fit is placement's ranking walked in order, each host
passed over recorded with why (as ``fleet_full`` says it).

The target's own admission has the last word when the move arrives
(`MoveTargets._begin`): a best-fit target that refuses there (`TARGET_REFUSALS`)
gives way to the next candidate, persisted before it is asked; a named one's
refusal fails the move.
"""

from __future__ import annotations

import time

from sqlalchemy import select, update

from ...errors import FuseError, MoveRefused
from ..store import moves as moves_t
from .records import QUICK_TIMEOUT, MoveRecords, log

ANSWER_TIMEOUT = 5.0  # s: a move's target must answer GET /v1/host within this before the VM sleeps

# How a target says no to an arriving VM before taking anything (the agent's
# ``POST /v1/host/incoming``): its admission (memory, its --max-vms VM-count policy,
# pressure), a VM of that name already there, another bundle or platform. Nothing was
# copied then, so a target chosen by best fit gives way to the next candidate.
TARGET_REFUSALS = frozenset({"host_full", "vm_exists", "bundle_mismatch", "platform_mismatch"})


def refuse(code: str, message: str) -> MoveRefused:
    return MoveRefused(message, code=code)


class MoveTargets(MoveRecords):
    """Choosing and checking a move's target host."""

    def compatible(self, vm: dict, source: str, target: str) -> str | None:
        """Why `target` cannot take `vm` from `source` (platform, bundle,
        Firecracker release), or None."""
        s, t = self.fleet.views[source].summary, self.fleet.views[target].summary
        if s.get("platform") != t.get("platform"):
            return f"platform differs: {s.get('platform')} on {source}, {t.get('platform')} on {target}"
        # the target's agent looks the bundle up by the VM's bundle name, then checks its
        # fingerprint: the same bytes under another name are no bundle for it
        fp, name = vm.get("bundle_fingerprint"), vm.get("bundle")
        bundles = t.get("bundles", [])
        if not any(b.get("fingerprint") == fp and (not name or b.get("name") == name) for b in bundles):
            elsewhere = sorted(b.get("name") for b in bundles if b.get("fingerprint") == fp and b.get("name"))
            return (f"host {target} lacks bundle {name} with fingerprint {(fp or '')[:12]}"
                    + (f" (it has those bytes as {', '.join(elsewhere)}: a VM wakes only in a bundle of its "
                       f"own name)" if elsewhere else ""))
        # (only a Firecracker VM's state depends on the release: seed 000 has it "" on qemu hosts,
        # and a qemu agent that merely finds a firecracker binary on PATH must not block a move)
        if ("firecracker" in (s.get("backend"), t.get("backend"))
                and s.get("firecracker", "") != t.get("firecracker", "")):
            return f"firecracker release differs: {s.get('firecracker') or 'none'} vs {t.get('firecracker') or 'none'}"
        mine = vm.get("platform") or {}
        if t.get("accel") and mine.get("accel") and mine["accel"] != t["accel"]:
            return f"accelerator differs: {mine['accel']} vs {t['accel']}"
        return None

    def _target(self, name: str, source: str, vm: dict, to: str | None,
                leftovers: dict[str, str] | None = None) -> str:
        """The host the VM goes to: ``to``, checked, or the best fit. ``leftovers``:
        hosts that still hold a copy of the VM a failed move left (``_clear_leftovers``)."""
        from ..placement import rank
        from ..resources import Resources
        ask = Resources.vm(vm["shape"]["vcpus"], vm["shape"]["mem_mib"])
        named = {r["host"] for r in self.store.vms_named(name) if r["host"] != source}

        def name_taken(h: str) -> bool:  # (a host's own VMs, or the same machine's under another id)
            return any(t == h or self._same_machine(t, h) for t in named)

        if to is not None:
            host = self.store.get_host(to)
            if host is None:
                raise refuse("unknown_host", f"host {to} is not registered")
            if to == source:
                raise refuse("same_host", f"vm {name} is already on {to}")
            if self._same_machine(source, to):
                raise refuse("same_host", f"host {to} is the same machine as {source} (the same agent, "
                                          f"registered under another id): vm {name} is already there")
            if host["state"] != "active":
                raise refuse("no_target", f"host {to} is {host['state']}: it takes no new VMs")
            if name_taken(to):
                raise refuse("no_target", f"host {to} already has a vm named {name}")
            view = self.fleet.views.get(to)
            if view is None or not view.connected:
                raise refuse("host_unreachable", f"target host {to} is not connected")
            if to in (leftovers or {}):
                raise refuse("no_target", f"host {to} {leftovers[to]}")
            if why := self.compatible(vm, source, to):
                raise refuse("arch_mismatch", why)
            # The same filter an automatic target passes (memory, vm_count
            # policy and its agent's own max_vms, memory pressure), so a target
            # without room is refused now, with its reason, not by its admission
            # halfway through.
            fleet, reasons = self.ctl.vms.arrays(only=to)
            decision = rank(fleet, ask, reasons)
            if to not in decision.order:
                raise refuse("no_target", f"host {to} has no room for vm {name}: "
                                          f"{decision.reasons.get(to, 'not accepting placements')}")
            return to
        host, passed = self._best_fit(name, source, vm, leftovers or {})
        if host is not None:
            return host
        raise _no_target(name, source, passed)

    async def _answers(self, to: str) -> None:
        """A named target asked once before anything touches the VM: a poller takes a few
        seconds to see an agent die, and a move to it had slept the VM for nothing (202, then
        failed). One that does not answer is refused (host_unreachable)."""
        try:
            await self._host(to, "GET", "/v1/host", timeout=ANSWER_TIMEOUT)
        except FuseError as exc:
            raise refuse("host_unreachable", f"target host {to} did not answer: {exc.message}") from None

    async def _answering(self, name: str, source: str, vm: dict, target: str,
                         leftovers: dict[str, str] | None = None) -> str:
        """The best-fit ``target`` once its agent answers now (as ``_answers``); one that does
        not gives way to the next host."""
        out: dict[str, str] = {}
        while True:
            try:
                await self._host(target, "GET", "/v1/host", timeout=ANSWER_TIMEOUT)
                return target
            except FuseError as exc:
                out[target] = f"did not answer: {exc.message}"
            target, passed = self._best_fit(name, source, vm, leftovers or {}, exclude=out)
            if target is None:
                raise _no_target(name, source, passed)

    def _best_fit(self, name: str, source: str, vm: dict, leftovers: dict[str, str],
                  exclude: dict[str, str] | None = None) -> tuple[str | None, dict[str, str]]:
        """The best-fit target for ``vm`` (None when no host can take it), and every
        other host -> why it is not the target (as fleet_full says). ``exclude``:
        hosts already out, with their reasons (targets that refused the VM)."""
        from ..placement import rank
        from ..resources import Resources
        ask = Resources.vm(vm["shape"]["vcpus"], vm["shape"]["mem_mib"])
        named = {r["host"] for r in self.store.vms_named(name) if r["host"] != source}
        exclude = exclude or {}
        fleet, reasons = self.ctl.vms.arrays()
        decision = rank(fleet, ask, reasons)
        passed: dict[str, str] = {}
        for h in decision.order:
            if h == source:
                continue
            if h in exclude:
                passed[h] = exclude[h]
            elif self._same_machine(source, h):
                passed[h] = f"the same machine as {source} (the same agent under another id)"
            elif self.fleet.views.get(h) is None:
                passed[h] = "host is disconnected"
            elif why := self.compatible(vm, source, h):
                passed[h] = why
            elif any(t == h or self._same_machine(t, h) for t in named):
                passed[h] = f"has room, but a vm named {name} already there"
            elif h in leftovers:
                passed[h] = leftovers[h]
            else:
                return h, passed
        passed |= {h: why for h, why in decision.reasons.items() if h != source}
        return None, passed | {h: why for h, why in exclude.items() if h != source}

    def _same_machine(self, a: str, b: str) -> bool:
        """Whether two host ids reach one agent (its identity, as usage counts
        machines): a move between them would only put the VM to sleep."""
        def ident(host_id: str) -> str:
            view = self.fleet.views.get(host_id)
            row = self.store.get_host(host_id) or {}
            return (view.summary.get("agent_id", "") if view else "") or row.get("agent_id", "")
        return bool(ident(a)) and ident(a) == ident(b)

    async def _begin(self, row: dict) -> dict:
        """Have the target begin its incoming side: its admission takes the VM and
        reserves its room, or refuses before a byte is copied. A target chosen by
        best fit that refuses (`TARGET_REFUSALS`: its --max-vms policy, memory, a VM
        of the name) gives way to the next candidate, as a create does (seed 004: "a
        refusal moves on to the next host"); the move's ``to`` becomes that host.
        Only when no host accepts does the move fail, its reason naming each host's
        answer, and the VM go home. A named target's refusal fails the move: the
        caller chose that host. Returns the row (its target as it now is)."""
        rec = row["record"]
        vm = rec["vm"]
        refused: dict[str, str] = {}
        while True:
            try:
                await self._host(row["target"], "POST", "/v1/host/incoming", timeout=QUICK_TIMEOUT, json={
                    "move_id": row["id"], "platform": vm.get("platform") or {}, "files": rec["files"],
                    "vm": {"name": row["vm"], "shape": vm["shape"], "entry": vm["entry"], "bundle": vm["bundle"],
                           "bundle_fingerprint": vm["bundle_fingerprint"], "created_at": vm.get("created_at")}})
                return row
            except FuseError as exc:
                if not rec.get("best_fit") or exc.code not in TARGET_REFUSALS:
                    raise
                refused[row["target"]] = exc.message.removeprefix(f"host {row['target']}: ")
            log.info("move %s: target %s refused vm %s (%s); trying the next host", row["id"], row["target"],
                     row["vm"], refused[row["target"]])
            async with self._lock:  # (as at the move's start: each choice sees the room the others hold)
                host, passed = self._best_fit(row["vm"], row["source"], vm, {}, exclude=refused)
                if host is None:
                    others = {h: why for h, why in passed.items() if h not in refused}
                    raise FuseError(f"no host accepted vm {row['vm']}: "
                                    + "; ".join(f"{h}: {why}" for h, why in refused.items())
                                    + (("; no other host can take it: " + "; ".join(
                                        f"{h}: {why}" for h, why in sorted(others.items()))) if others else ""),
                                    code="no_target")
                row = self._retarget(row, host, refused)

    def _retarget(self, row: dict, host: str, refused: dict[str, str]) -> dict:
        """Point a move whose target refused the VM at ``host``, persisted (with the
        refusals) before anything is asked of it: recovery after a crash settles the
        move with the target it reads, and the room the move holds moves along."""
        with self.store.tx() as c:
            cur = dict(c.execute(select(moves_t).where(moves_t.c.id == row["id"])).mappings().one())
            record = dict(cur["record"] or {}, refused=dict(refused))
            c.execute(update(moves_t).where(moves_t.c.id == row["id"]).values(
                target=host, record=record, updated_at=time.time()))
            self.store.add_event("move_retargeted", {"move": row["id"], "vm": row["vm"], "from": cur["target"],
                                                    "to": host, "refused": dict(refused)},
                                 host=row["source"], conn=c)
        if self.fleet:
            self.fleet.changed.set()
        return self._row(row["id"])


def _no_target(name: str, source: str, passed: dict[str, str]) -> MoveRefused:
    """409 no_target with every other host's reason (as fleet_full says them)."""
    if not passed:
        return refuse("no_target", f"no other host can take vm {name}: {source} is the only host registered")
    return MoveRefused(f"no other host can take vm {name}: " + "; ".join(f"{h}: {why}" for h, why in sorted(passed.items())),
                       code="no_target", details={"hosts": dict(sorted(passed.items()))})
