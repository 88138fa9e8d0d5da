"""Review 36: an answer from a host that is not its agent's. A gateway, load balancer or WAF
in front of an agent passes a request on and answers with a page of its own (a 200 HTML
page, a 400 page, a JSON body of another shape), or the link to an agent is gone.

- `GET /v1/usage` was a 500 for the whole fleet when one host answered so: that host is in
  `unreachable`, with why, and the others' report is whole.
- The poller took a summary (`GET /v1/host`) that is no JSON for a traceback every poll,
  and kept the host connected on the figures it had last; a 200 `{}` read as a host with
  0 MiB free. Each is a failed poll now: the host goes disconnected, saying why.
- An events page that is no JSON was a traceback every poll: it is a failed read, and the
  events come once the page is the agent's again.
- "All connection attempts failed" hid the OS's reason under it ("no route to host")."""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from support import FUSE, Proc, fake_bundle, free_port, ip, start_agent, start_controller, veth_netns, wait_until

HTML = (200, "text/html", b"<html><body>gateway</body></html>")


class Gateway:
    """An HTTP proxy in front of an agent: each request goes on to the agent, and one whose
    method and path are in ``pages`` is then answered with the gateway's own page (status,
    content type, body) in place of the agent's; ``hits`` counts those."""

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.pages: dict[tuple[str, str], tuple[int, str, bytes]] = {}
        self.hits: Counter = Counter()
        gw = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _pass(self):
                n = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(n) if n else b""
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
                r = httpx.request(self.command, gw.upstream + self.path, headers=headers, content=body, timeout=60)
                page = gw.pages.get((self.command, self.path.split("?")[0]))
                if page is not None:
                    gw.hits[self.path.split("?")[0]] += 1
                status, ctype, out = page or (r.status_code, r.headers.get("content-type", ""), r.content)
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PUT = do_DELETE = _pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fleet(tmp_path, procs):
    """h1: an agent reached directly; h2: another, behind a gateway. A VM on each."""
    a1 = start_agent(tmp_path, backend="fake", name="a1")
    procs.append(a1)
    a2 = start_agent(tmp_path, backend="fake", name="a2")
    procs.append(a2)
    gw = Gateway(a2.url)
    ctl = start_controller(tmp_path, listen=True, token="ct")
    procs.append(ctl)
    c = httpx.Client(base_url=f"http://127.0.0.1:{ctl.extra['port']}", headers={"Authorization": "Bearer ct"},
                     timeout=60)
    for host, url in (("h1", a1.url), ("h2", gw.url)):
        r = c.post("/v1/hosts", json={"id": host, "url": url, "token": "agent-token", "backend": "qemu",
                                      "capacity": {"vm_count": 4}})
        assert r.status_code in (200, 201), r.text
        r = c.post("/v1/vms", json={"name": f"v{host[1]}", "host": host, "shape": {"vcpus": 1, "mem_mib": 128},
                                    "entry": "sleep 600"})
        assert r.status_code == 201, r.text
    yield type("Fleet", (), {"c": c, "gw": gw, "ctl": ctl})
    gw.pages.clear()
    for v in c.get("/v1/vms").json().get("vms", []):
        c.delete(f"/v1/vms/{v['name']}")
    c.close()
    gw.close()


def tracebacks(ctl) -> int:
    return ctl.logs().count("Traceback")


def host_view(c: httpx.Client, host: str) -> dict:
    r = c.get("/v1/hosts")
    assert r.status_code == 200, r.text
    return next(h for h in r.json()["hosts"] if h["id"] == host)


def disconnects(c: httpx.Client, host: str) -> list[str]:
    return [e.get("reason", "") for e in c.get("/v1/events", params={"since": 0}).json()["events"]
            if e["type"] == "host_disconnected" and e.get("host") == host]


@pytest.mark.parametrize("page, why", [
    (HTML, "the host's usage report (GET /v1/host/usage) is not a fuse agent's: it is not JSON"),
    ((400, "text/html", b"<html>400 Bad Request</html>"), "host answered 400"),
    ((200, "application/json", b"[]"),
     "the host's usage report (GET /v1/host/usage) is not a fuse agent's: a JSON list, not an object"),
    ((200, "application/json", b'{"vms": [1], "totals": {}}'),
     "the host's usage report (GET /v1/host/usage) is not a fuse agent's: its vms hold an entry that is not "
     "a VM's row"),
    ((200, "application/json", b"{}"),
     "the host's usage report (GET /v1/host/usage) is not a fuse agent's: it has no list of vms"),
], ids=["a 200 HTML page", "a 400 HTML page", "a JSON list", "rows that are not rows", "an empty object"])
def test_one_hosts_usage_page_leaves_it_unreachable_and_the_fleets_report_whole(fleet, page, why):
    c, before = fleet.c, tracebacks(fleet.ctl)
    fleet.gw.pages[("GET", "/v1/host/usage")] = page
    r = c.get("/v1/usage")
    assert r.status_code == 200, r.text  # (it was 500 internal: JSONDecodeError, AttributeError)
    u = r.json()
    assert u["unreachable"] == ["h2"] and u["unreachable_reasons"] == {"h2": why}, u
    assert [(row["host"], row["vm"]) for row in u["vms"]] == [("h1", "v1")], u["vms"]
    assert u["totals"]["wall_seconds"] > 0
    assert fleet.gw.hits["/v1/host/usage"] == 1
    assert tracebacks(fleet.ctl) == before, fleet.ctl.logs()[-3000:]
    fleet.gw.pages.clear()
    u = c.get("/v1/usage").json()
    assert u["unreachable"] == [] and {row["host"] for row in u["vms"]} == {"h1", "h2"}, u


@pytest.mark.parametrize("page, why", [
    (HTML, "the host's summary (GET /v1/host) is not a fuse agent's: it is not JSON"),
    ((200, "application/json", b"{}"),
     "the host's summary (GET /v1/host) is not a fuse agent's: it has no valid cpus (field required)"),
], ids=["a 200 HTML page", "a 200 {}"])
def test_a_summary_that_is_not_an_agents_is_a_failed_poll(fleet, page, why):
    c, before = fleet.c, tracebacks(fleet.ctl)
    assert host_view(c, "h2")["connected"] is True
    fleet.gw.pages[("GET", "/v1/host")] = page
    # (two failed polls in a row, a second apart: it was held connected on its last figures)
    wait_until(lambda: host_view(c, "h2")["connected"] is False, timeout=15, what="h2 read as out of reach")
    assert disconnects(c, "h2")[-1] == why
    r = c.post("/v1/vms", json={"name": "p2", "host": "h2", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "true"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "fleet_full", r.text
    assert why in r.text and "0 MiB free" not in r.text, r.text  # (the {} was a host with 0 MiB free)
    time.sleep(2)  # (more polls, failed)
    assert fleet.gw.hits["/v1/host"] >= 3
    assert tracebacks(fleet.ctl) == before, fleet.ctl.logs()[-3000:]  # (it was one each poll)
    fleet.gw.pages.clear()
    wait_until(lambda: host_view(c, "h2")["connected"] is True, timeout=15, what="h2 back")


def test_an_events_page_that_is_not_json_is_no_traceback_and_the_events_come_after(fleet):
    c, before = fleet.c, tracebacks(fleet.ctl)
    since = c.get("/v1/events", params={"since": 0}).json()["next"]
    fleet.gw.pages[("GET", "/v1/host/events")] = HTML
    r = c.post("/v1/vms", json={"name": "e2", "host": "h2", "shape": {"vcpus": 1, "mem_mib": 128},
                                "entry": "sleep 600"})
    assert r.status_code == 201, r.text
    wait_until(lambda: fleet.gw.hits["/v1/host/events"] >= 3, timeout=20, what="the events page read 3 times")
    assert tracebacks(fleet.ctl) == before, fleet.ctl.logs()[-3000:]  # (it was one each poll)
    assert host_view(c, "h2")["connected"] is True  # (its summary is the agent's: placement goes on)
    fleet.gw.pages.clear()

    def created():
        events = c.get("/v1/events", params={"since": since}).json()["events"]
        return [e for e in events if e.get("vm") == "e2" and e.get("host") == "h2" and e.get("host_event_id")]
    got = wait_until(created, timeout=40, what="h2's events of e2 read once the page is the agent's")
    assert len({e["host_event_id"] for e in got}) == len(got)


# ------------------------------------------------------------------ the OS's reason

@pytest.fixture
def netns():
    yield from veth_netns("r")


def test_an_agent_whose_network_is_gone_is_no_route_to_host(tmp_path, procs, netns):
    """The agent's end of the link down: no answer to ARP, so the kernel says EHOSTUNREACH
    ("[Errno 113] Connect call failed", under anyio's "All connection attempts failed")."""
    state = tmp_path / "a3"
    state.mkdir()
    fake_bundle(state)
    port, log = free_port(), tmp_path / "a3.log"
    agent = Proc(subprocess.Popen(["ip", "netns", "exec", netns["name"], *FUSE, "host", "serve", "--listen",
                                   f"{netns['addr']}:{port}", "--state-dir", str(state), "--backend", "fake",
                                   "--token", "t", "--socket", str(tmp_path / "a3.sock")],
                                  stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True),
                 log, url=f"http://{netns['addr']}:{port}", token="t", state_dir=state)
    procs.append(agent)
    wait_until(lambda: httpx.get(agent.url + "/v1/host", headers={"Authorization": "Bearer t"},
                                 timeout=2).status_code == 200, what="the agent in the namespace")
    ctl = start_controller(tmp_path, listen=True, token="ct")
    procs.append(ctl)
    with httpx.Client(base_url=f"http://127.0.0.1:{ctl.extra['port']}", headers={"Authorization": "Bearer ct"},
                      timeout=60) as c:
        r = c.post("/v1/hosts", json={"id": "h3", "url": agent.url, "token": "t", "backend": "qemu",
                                      "capacity": {"vm_count": 2}})
        assert r.status_code in (200, 201), r.text
        ip("-n", netns["name"], "link", "set", netns["ns_if"], "down")
        # (a request on a connection kept alive from before times out instead: once the poller
        # has found the host gone, none is left, and each request connects anew)
        wait_until(lambda: host_view(c, "h3")["connected"] is False, timeout=30, what="h3 disconnected")

        def reason():
            said = c.get("/v1/usage").json()["unreachable_reasons"].get("h3", "")
            return said if "in time" not in said and "within" not in said else None
        said = wait_until(reason, timeout=60, interval=1, what="a connect's reason")
        assert said == f"cannot reach {agent.url}: no route to host", said  # (was "All connection attempts failed")


def test_an_address_with_no_route_says_so(tmp_path, procs):
    """No namespace needed: the kernel refuses a connect to the broadcast address at once
    (ENETUNREACH), which the registration's reason now says."""
    ctl = start_controller(tmp_path, listen=True, token="ct")
    procs.append(ctl)
    with httpx.Client(base_url=f"http://127.0.0.1:{ctl.extra['port']}", headers={"Authorization": "Bearer ct"},
                      timeout=60) as c:
        r = c.post("/v1/hosts", json={"id": "h9", "url": "http://255.255.255.255:9", "token": "t", "backend": "qemu",
                                      "capacity": {"vm_count": 2}})
    assert r.status_code == 502 and r.json()["error"]["code"] == "host_unreachable", r.text
    assert "network is unreachable" in r.json()["error"]["message"], r.text
    assert "All connection attempts failed" not in r.text, r.text


def test_the_reason_under_a_group_of_attempts_is_the_oss():
    """A name that resolves to several addresses: anyio's group of the attempts' errors is read
    too (its members are the OS errors)."""
    from fuse.transport import _describe, parse_address
    group = ExceptionGroup("multiple connection attempts failed",
                           [OSError(113, "Connect call failed ('10.0.0.1', 9)"),
                            OSError(113, "Connect call failed ('fd00::1', 9)")])
    try:
        try:
            raise OSError("All connection attempts failed") from group
        except OSError as exc:
            raise httpx.ConnectError("All connection attempts failed") from exc
    except httpx.ConnectError as exc:
        why, _ = _describe(exc, parse_address("http://agent.example:9"))
    assert why == "cannot reach http://agent.example:9: no route to host", why


@pytest.mark.parametrize("page, why", [
    ((200, "application/json", b'{"vms": [{"name": "v2", "state": "running"}]}'),
     "the host's VM list (GET /v1/host/vms) is not a fuse agent's: vms[0]: shape None is not whole vcpus and mem_mib"),
    ((200, "application/json", b'{"vms": {"v2": {}}}'),
     "the host's VM list (GET /v1/host/vms) is not a fuse agent's: vms is a JSON dict, not a list"),
    ((200, "application/json", b'{"vms": [{"state": "running", "shape": {"vcpus": 1, "mem_mib": 128}}]}'),
     "the host's VM list (GET /v1/host/vms) is not a fuse agent's: vms[0]: name None is not a non-empty string"),
], ids=["a record without its shape", "a list that is an object", "a record without its name"])
def test_a_vm_list_that_is_not_an_agents_is_a_failed_poll_and_adopted_once_it_is(fleet, page, why):
    """(review 37, the thirty-sixth session's known item: the adoption read each record field by
    field, a KeyError each poll — a traceback — and the host's VMs were never adopted)"""
    c, before = fleet.c, tracebacks(fleet.ctl)
    fleet.gw.pages[("GET", "/v1/host")] = HTML  # (the adoption runs as the host connects again)
    wait_until(lambda: host_view(c, "h2")["connected"] is False, timeout=15, what="h2 read as out of reach")
    fleet.gw.pages[("GET", "/v1/host/vms")] = page
    del fleet.gw.pages[("GET", "/v1/host")]
    wait_until(lambda: fleet.gw.hits["/v1/host/vms"] >= 3, timeout=20, what="the VM list read 3 times")
    assert host_view(c, "h2")["connected"] is False
    r = c.post("/v1/vms", json={"name": "p2", "host": "h2", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "true"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "fleet_full", r.text
    assert r.json()["error"]["hosts"]["h2"] == f"host is disconnected: {why}", r.text
    assert tracebacks(fleet.ctl) == before, fleet.ctl.logs()[-3000:]
    fleet.gw.pages.clear()
    wait_until(lambda: host_view(c, "h2")["connected"] is True, timeout=15, what="h2 back")
    assert {(v["host"], v["name"]) for v in c.get("/v1/vms").json()["vms"]} == {("h1", "v1"), ("h2", "v2")}
