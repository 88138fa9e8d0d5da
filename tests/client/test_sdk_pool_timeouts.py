"""README: "for every call but those that wait on the fleet, which wait as long as their work
may take ...: the pool's calls 600 s". A README audit found the budget, hosts, prewarms and
cloud-link calls giving up at the client's own timeout (an aws link waits on EC2). Against a
real TCP server that accepts and never answers: each pool call is still waiting well past the
client's timeout, and ends (unreachable) once the server goes."""

from __future__ import annotations

import socket
import threading
import time

import pytest

import fuse

CALLS = {
    "cloud_budget": lambda c: c.pool.cloud_budget(),
    "cloud_budget update": lambda c: c.pool.cloud_budget(fuse.ElasticBudgetUpdate(max_usd_per_hour=1.0)),
    "cloud_hosts": lambda c: c.pool.cloud_hosts(),
    "prewarms": lambda c: c.pool.prewarms(),
    "clouds": lambda c: c.pool.clouds(),
    "link_cloud": lambda c: c.pool.link_cloud("dev", "local", {}),
    "unlink_cloud": lambda c: c.pool.unlink_cloud("dev"),
}


@pytest.mark.parametrize("call", list(CALLS.values()), ids=list(CALLS))
def test_a_pool_call_waits_past_the_clients_timeout(call):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(silent.accept()[0]), daemon=True).start()
    outcome: list[BaseException | object] = []
    client = fuse.Client(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.5)

    def run():
        try:
            outcome.append(call(client))
        except BaseException as exc:  # noqa: BLE001 - what ended it is the assertion
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    try:
        time.sleep(2.0)  # 4 × the client's timeout
        assert outcome == [], outcome  # still waiting on the pool (it gave up after 0.5 s)
    finally:
        for conn in accepted:
            conn.close()
        silent.close()
    worker.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], fuse.ApiError), outcome
    client.close()
