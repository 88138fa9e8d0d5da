"""Review 30 of moves: a prewarm's standby VM is refused at once (it was 202, then failed
at its sleep), and a host that drops the connection is named with its role in the reason
(it named an address)."""

from __future__ import annotations

import fuse
from support import Proxy, api_error, wait_until
from test_moves import vm_body


class HangUpOn(Proxy):
    """Hangs up on each request that starts with ``prefix``, before it reaches the agent."""

    def __init__(self, upstream_port: int, prefix: bytes):
        super().__init__(upstream_port)
        self.prefix = prefix

    def _forward(self, data: bytes) -> bool:
        return not data.startswith(self.prefix) and super()._forward(data)


def test_a_standby_vm_is_not_movable_at_once(fleet):
    fleet.add("src", fleet.agent("a-src"))
    fleet.add("dst", fleet.agent("a-dst"))
    fleet.client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=256, on="host:src"))
    sb = wait_until(lambda: [v["name"] for v in fleet.client.vms.list() if v.get("standby") and v["state"] == "running"],
                    timeout=60, what="the prewarm's standby VM running")[0]
    err = api_error(fleet.client.moves.create, sb, to="dst")
    assert (err.status, err.code) == (409, "not_movable") and "standby" in err.message, err
    assert fleet.client.moves.list() == []  # (no move recorded, no failed one in the list)


def test_a_source_that_drops_the_connection_is_named_in_the_reason(fleet):
    src = fleet.agent("a-src")
    proxy = HangUpOn(int(src.url.rsplit(":", 1)[1]), b"POST /v1/host/vms/job/sleep")
    try:
        fleet.client.hosts.register(fuse.RegisterHostRequest(id="src", url=proxy.url, token=src.token,
                                                             backend="qemu", capacity=fuse.HostCapacity(vm_count=4)))
        fleet.add("dst", fleet.agent("a-dst"))
        fleet.client.vms.create(vm_body("job", host="src"))
        m = fleet.client.moves.create("job", to="dst")
        m = wait_until(lambda: (x := fleet.client.moves.get(m["id"]))["state"] in ("done", "failed") and x,
                       timeout=60, what="the move to fail")
        assert m["state"] == "failed" and m["reason"].startswith("source host src: "), m["reason"]
    finally:
        proxy.close()
