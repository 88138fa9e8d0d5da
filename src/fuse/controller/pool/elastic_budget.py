"""The elastic pool's budget: its settings, what the hosts cost so far, and the caps a purchase must keep.

``BudgetMixin`` is the part of ``ElasticPool`` (``elastic``) that answers the budget
(``ElasticBudget``: month spent, USD per hour running), turns it into the plans'
``Constraints``, and checks a purchase whole against every cap, the clouds' quotas
and type limits included, before anything is bought (``BudgetExceeded`` names the
cap). The billing of one host is ``elastic_host``'s.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from ...errors import Conflict
from ...models.pool import ElasticBudget, ElasticBudgetUpdate
from .elastic_host import LIVE, committed_usd, month_usd, pending_usd
from .model import Constraints, Offer

BUDGET_KEY = "pool_budget"
DEFAULT_BUDGET = {"autoscale": False, "max_usd_per_hour": 0.0, "monthly_usd": 0.0, "max_new_hosts": 0,
                  "warm": True, "allow_metal": True}


class BudgetExceeded(Conflict):
    code = "budget_exceeded"


class BudgetMixin:
    """The budget and its caps: part of ``ElasticPool``."""

    def _budget_settings(self) -> dict[str, Any]:
        return DEFAULT_BUDGET | self.store.get_setting(BUDGET_KEY, {})

    def budget(self) -> ElasticBudget:
        now = time.time()
        rows = self.rows()
        live = [r for r in rows if r["state"] in LIVE]
        return ElasticBudget(**self._budget_settings(), month_usd=round(sum(month_usd(r, now) for r in rows), 6),
                             running_usd_per_hour=round(sum(r["usd_per_hour"] for r in live), 6), hosts=len(live))

    def update_budget(self, update_: ElasticBudgetUpdate) -> ElasticBudget:
        given = update_.model_dump(exclude_none=True)  # the record refuses negative, NaN and unknown caps
        if given:  # an empty update reads the budget: nothing is written
            self.store.put_setting(BUDGET_KEY, self._budget_settings() | given)
            self.store.add_event("budget_set", given)
        return self.budget()

    def constraints(self) -> Constraints:
        """The budget's caps and the clouds' quotas less what the running elastic hosts already use
        (the $/h running said beside the cap: an answer quotes the cap as set, not what is left)."""
        b = self.budget()
        quota_running, limit_running = self.caps_running()
        return Constraints(
            max_usd_per_hour=max(0.0, b.max_usd_per_hour - b.running_usd_per_hour) if b.max_usd_per_hour else None,
            running_usd_per_hour=b.running_usd_per_hour if b.max_usd_per_hour else None,
            max_new_hosts=max(0, b.max_new_hosts - b.hosts) if b.max_new_hosts else None,
            monthly_usd_left=max(0.0, b.monthly_usd - b.month_usd - self._committed()) if b.monthly_usd else None,
            allow_metal=b.allow_metal, quotas=self.quotas_left(), quota_running=quota_running,
            limit_running=limit_running)

    def _check_budget(self, offer: Offer, count: int, usd_each: float) -> None:
        """BudgetExceeded unless ``count`` more machines of ``offer`` (each
        projected to cost ``usd_each``) stay within every cap."""
        self._check_caps([(offer, usd_each)] * count)

    def _check_caps(self, machines: list[tuple[Offer, float]]) -> None:
        """BudgetExceeded unless all of ``machines`` (offer, projected USD) together
        stay within every cap: a purchase is checked whole, before anything is bought."""
        b = self.budget()
        what = ", ".join(sorted({o.type_name for o, _ in machines}))
        metal = sorted({o.type_name for o, _ in machines if o.metal})
        if metal and not b.allow_metal:
            raise BudgetExceeded(f"{', '.join(metal)} is a metal type and the budget's allow_metal is off")
        count = len(machines)
        if b.max_new_hosts and b.hosts + count > b.max_new_hosts:
            raise BudgetExceeded(f"{count} more hosts would make {b.hosts + count}; the budget allows "
                                 f"{b.max_new_hosts} (max_new_hosts)")
        add = sum(o.usd_per_hour for o, _ in machines)
        if b.max_usd_per_hour and b.running_usd_per_hour + add > b.max_usd_per_hour + 1e-9:
            raise BudgetExceeded(f"{count} × {what} adds ${add:.4f}/h to ${b.running_usd_per_hour:.4f}/h "
                                 f"running; the budget allows ${b.max_usd_per_hour:.4f}/h (max_usd_per_hour)")
        spent, cost = b.month_usd + self._committed(), sum(u for _, u in machines)
        if b.monthly_usd and spent + cost > b.monthly_usd + 1e-9:
            raise BudgetExceeded(f"{count} × {what} would cost ${cost:.4f} with ${spent:.4f} spent or committed "
                                 f"this month, ${spent + cost:.4f} in all; the budget allows ${b.monthly_usd:.4f} "
                                 "(monthly_usd)")
        self._check_cloud_caps(machines)

    def _check_cloud_caps(self, machines: list[tuple[Offer, float]]) -> None:
        """BudgetExceeded unless ``machines`` stay within their clouds' quotas and type limits,
        counted with the machines the clouds run already (``in_use``)."""
        vcpus, running = self.in_use()
        add_vcpus: Counter = Counter()
        add_machines: Counter = Counter()
        quotas, limits = {}, {}
        for o, _ in machines:
            add_vcpus[o.quota_family] += o.vcpus
            add_machines[(o.provider, o.type_name)] += 1
            limits[(o.provider, o.type_name)] = o.limit
            quotas[o.quota_family] = (o.provider, self.provider(o.provider).quotas.get(o.quota_family))
        for (cloud, type_name), n in sorted(add_machines.items()):
            limit = limits[(cloud, type_name)]
            if limit is not None and running[(cloud, type_name)] + n > limit:
                raise BudgetExceeded(f"{n} more {type_name} would make {running[(cloud, type_name)] + n} in cloud "
                                     f"{cloud}; its limit for the type is {limit} (limits)")
        for family, n in sorted(add_vcpus.items()):
            cloud, quota = quotas[family]
            if quota is not None and vcpus[family] + n > quota:
                raise BudgetExceeded(f"{n} more vCPUs of quota family {family.partition(':')[2]} would make "
                                     f"{vcpus[family] + n} in cloud {cloud}; its quota is {quota} vCPUs (quotas)")

    def _committed(self) -> float:
        now = time.time()
        return sum(committed_usd(r, now) + pending_usd(r, now) for r in self.rows() if r["state"] in LIVE)
