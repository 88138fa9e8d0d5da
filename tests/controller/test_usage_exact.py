"""Fleet usage stays exact end to end: two real agents (fake backend) whose
metering holds month-long 16 GiB VMs, summed by a real controller. The raw
JSON body, read with decimals, has totals equal to the sums of its rows and
of the hosts' own totals, to the last digit (17 significant digits: more
than a float holds)."""

from __future__ import annotations

import json
from decimal import Decimal

import httpx

from fuse.agent.metering import Metering

FIGURES = ("cpu_seconds", "mem_mib_seconds", "wall_seconds", "state_bytes_written")
T0 = 1_700_000_000.0


def seeded(fleet, name: str, held: dict[str, float]):
    """An agent whose metering file already holds ``held`` (VM -> seconds at 16 GiB)."""
    state = fleet.tmp / name
    state.mkdir(parents=True, exist_ok=True)
    m = Metering(state / "metering.json")
    for vm, seconds in held.items():
        m.start(vm, 16384, None, now=T0)
        m.segments[-1]["cpu_s"] = seconds / 7
        m.stop(vm, now=T0 + seconds)
    return fleet.agent(name)


def exact(client: httpx.Client, path: str, **params) -> dict:
    r = client.get(path, params=params)
    assert r.status_code == 200, r.text
    return json.loads(r.content, parse_float=Decimal)


def test_fleet_usage_totals_are_the_exact_sums_of_the_hosts_rows(fleet):
    agents = {"h1": seeded(fleet, "a1", {"a": 2_592_000.1234567, "b": 2_592_000.7654321}),
              "h2": seeded(fleet, "a2", {"c": 2_592_000.9999994})}
    for host, agent in agents.items():
        fleet.add(host, agent)
    window = {"from": "0", "to": str(int(T0) + 3_000_000)}

    with httpx.Client(transport=httpx.HTTPTransport(uds=str(fleet.ctl.socket)), base_url="http://c") as c:
        fleet_usage = exact(c, "/v1/usage", **window)
    rows = fleet_usage["vms"]
    assert sorted((r["host"], r["vm"]) for r in rows) == [("h1", "a"), ("h1", "b"), ("h2", "c")]
    for figure in FIGURES:
        assert fleet_usage["totals"][figure] == sum(r[figure] for r in rows), figure
    assert all(r["mem_mib_seconds"] == 16384 * r["wall_seconds"] for r in rows)

    hosts_totals = []
    for agent in agents.values():
        with httpx.Client(base_url=agent.url, headers={"Authorization": f"Bearer {agent.token}"}) as c:
            hosts_totals.append(exact(c, "/v1/host/usage", **window)["totals"])
    for figure in FIGURES:
        assert fleet_usage["totals"][figure] == sum(t[figure] for t in hosts_totals), figure
    total = Decimal("127402014947.540992")
    assert fleet_usage["totals"]["mem_mib_seconds"] == total

    # The SDK still answers plain floats (the nearest to each exact figure).
    assert fleet.client.usage(from_=0, to=int(T0) + 3_000_000)["totals"]["mem_mib_seconds"] == float(total)
