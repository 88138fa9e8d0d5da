"""client.usage(exact=True) keeps every digit the controller wrote (review 17: the
SDK's floats made the rows' sum differ from the totals in the last digit)."""

from __future__ import annotations

from decimal import Decimal

import httpx

import fuse

BODY = (b'{"from": 0, "to": 10, "vms": ['
        b'{"host": "h1", "vm": "a", "wall_seconds": 0.1, "mem_mib_seconds": 363316.950336},'
        b'{"host": "h2", "vm": "b", "wall_seconds": 0.2, "mem_mib_seconds": 363316.950336}],'
        b' "totals": {"wall_seconds": 0.3, "mem_mib_seconds": 726633.900672}, "unreachable": []}')


def controller(request: httpx.Request) -> httpx.Response:
    assert request.url.path == "/v1/usage"
    return httpx.Response(200, content=BODY, headers={"content-type": "application/json"})


def test_exact_usage_reads_decimals_whose_rows_sum_to_the_totals():
    with fuse.Client("http://c", transport=httpx.MockTransport(controller)) as c:
        u = c.usage(exact=True)
        rough = c.usage()
    for key in ("wall_seconds", "mem_mib_seconds"):
        assert sum(r[key] for r in u["vms"]) == u["totals"][key]
        assert type(u["totals"][key]) is Decimal
    assert u["totals"]["wall_seconds"] == Decimal("0.3")
    assert sum(r["wall_seconds"] for r in rough["vms"]) != rough["totals"]["wall_seconds"]  # 0.1 + 0.2 in floats


async def test_the_async_client_reads_them_too():
    async with fuse.AsyncClient("http://c", transport=httpx.MockTransport(controller)) as c:
        u = await c.usage(exact=True)
    assert u["totals"]["mem_mib_seconds"] == Decimal("726633.900672")
