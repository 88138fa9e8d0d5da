"""Every rule of seed 000's host registry, against a real agent process."""

from __future__ import annotations

import os

import httpx
import pytest

import fuse
from fuse import HostCapacity, RegisterHostRequest
from support import api_error, free_port, start_agent


def reg(client, agent, **kw):
    cap = kw.pop("capacity", HostCapacity(vm_count=4))
    req = RegisterHostRequest(id=kw.pop("id", "h1"), url=kw.pop("url", agent.url), token=kw.pop("token", agent.token),
                              capacity=cap, **kw)
    return client.hosts.register(req)




def probed(agent):
    return httpx.get(agent.url + "/v1/host", headers={"Authorization": f"Bearer {agent.token}"}).json()


def test_seed_sample_runs_as_written(client, agent):
    agent_token = agent.token
    host = client.hosts.register(
        fuse.RegisterHostRequest(
            id="prod-east-1",
            url=agent.url,
            token=agent_token,
            region="us-east",
            backend="firecracker",
            capacity=fuse.HostCapacity(vm_count=20),  # cpus/ram_mb/storage_gb left at 0 to probe
        )
    )
    for w in host.warnings:
        print("warning:", w)
    real = probed(agent)
    assert host.id == "prod-east-1" and host.region == "us-east" and host.state == "active"
    assert (host.capacity.cpus, host.capacity.ram_mb) == (real["cpus"], real["ram_mb"])
    assert host.capacity.storage_gb > 0 and host.capacity.vm_count == 20


def test_rule1_id_is_primary_key_backend_defaults_to_firecracker_token_never_returned(client, agent):
    host = reg(client, agent, id="any free-form id/with spaces")
    assert host.backend == "firecracker"
    assert client.hosts.get("any free-form id/with spaces").id == "any free-form id/with spaces"
    raw = client._http.get("/v1/hosts").text + client._http.get("/v1/hosts/any%20free-form%20id%2Fwith%20spaces").text
    assert agent.token not in raw and "token" not in raw


@pytest.mark.parametrize("host_id", [".", ".."], ids=["a dot", "two dots"])
def test_rule1_ids_that_urls_resolve_away_are_400(client, agent, host_id):
    r = client._http.post("/v1/hosts", json={"id": host_id, "url": agent.url, "token": agent.token,
                                             "capacity": {"vm_count": 2}})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument", r.text
    assert client.hosts.list() == []


@pytest.mark.parametrize("host_id", ["...", "a/../b", "./x", "../"], ids=lambda i: f"{i} is an id")
def test_rule1_ids_with_dots_and_slashes_are_free_form(client, agent, host_id):
    assert reg(client, agent, id=host_id).id == host_id
    assert client.hosts.get(host_id).id == host_id
    client.hosts.cordon(host_id)
    client.hosts.deregister(host_id)
    assert client.hosts.list() == []


@pytest.mark.parametrize("backend,code", [("firecracker", 400), ("qemu", None)],
                         ids=["a firecracker host may not declare gpus", "a qemu host may declare gpus"])
def test_rule2_only_qemu_hosts_declare_gpus(client, agent, backend, code):
    cap = HostCapacity(vm_count=2, gpus=1, gpu_kind="nvidia:T4")
    if code:
        err = api_error(reg, client, agent, backend=backend, capacity=cap)
        assert (err.status, err.code) == (400, "invalid_argument") and "gpus" in err.message
        assert client.hosts.list() == []
    else:
        assert reg(client, agent, backend=backend, capacity=cap).capacity.gpus == 1


def test_rule3_zero_is_probed_declared_is_kept_and_overcommit_warns(client, agent):
    real = probed(agent)
    host = reg(client, agent, capacity=HostCapacity(vm_count=2, cpus=real["cpus"] * 8, ram_mb=1024))
    assert host.capacity.cpus == real["cpus"] * 8          # declared above the probe: kept
    assert host.capacity.ram_mb == 1024                    # declared below: kept, no warning
    assert host.capacity.storage_gb == real["storage_gb"] or abs(host.capacity.storage_gb - real["storage_gb"]) <= 1
    capacity_warnings = [w for w in host.warnings if w.startswith("capacity.")]
    assert len(capacity_warnings) == 1
    w = capacity_warnings[0]
    assert "cpus" in w and str(real["cpus"] * 8) in w and str(real["cpus"]) in w


@pytest.mark.parametrize("field,backend", [
    ("cpus", "firecracker"), ("ram_mb", "firecracker"), ("storage_gb", "firecracker"), ("gpus", "qemu"),
    ("mig_profiles['1g.10gb']", "qemu"),
], ids=["cpus above the probe", "ram_mb above the probe", "storage_gb above the probe", "gpus above the probe",
        "a MIG profile's count above the probe"])
def test_rule3_each_declared_value_above_the_probe_registers_with_a_warning(client, agent, field, backend):
    import re
    real = probed(agent)
    if field.startswith("mig_profiles"):
        real_value = (real.get("mig_profiles") or {}).get("1g.10gb", 0)
        declared = real_value + 3
        cap = HostCapacity(vm_count=2, mig_profiles={"1g.10gb": declared})
    else:
        real_value = real[field]
        declared = real_value + 1000
        cap = HostCapacity(vm_count=2, **{field: declared})
    host = reg(client, agent, backend=backend, capacity=cap)
    kept = host.capacity.mig_profiles["1g.10gb"] if field.startswith("mig") else getattr(host.capacity, field)
    assert kept == declared
    pattern = rf"capacity\.{re.escape(field)}: declared {declared} exceeds probed (\d+); keeping the declared value"
    found = [m for w in host.warnings if (m := re.fullmatch(pattern, w))]
    assert len(found) == 1, host.warnings
    assert abs(int(found[0].group(1)) - real_value) <= 1  # free disk may move by a GiB between the two probes


def test_rule4_unreachable_with_a_field_to_probe_is_502_and_stores_nothing(client, tmp_path):
    from support import free_port
    req = RegisterHostRequest(id="gone", url=f"http://127.0.0.1:{free_port()}", token="t",
                              capacity=HostCapacity(vm_count=2, cpus=4, ram_mb=4096))
    err = api_error(client.hosts.register, req)
    assert err.status == 502 and err.code == "host_unreachable" and "storage_gb" in err.message
    assert client.hosts.list() == []


def test_rule4_unreachable_with_all_declared_registers_with_a_warning(client):
    from support import free_port
    host = client.hosts.register(RegisterHostRequest(
        id="declared", url=f"http://127.0.0.1:{free_port()}", token="t",
        capacity=HostCapacity(vm_count=2, cpus=4, ram_mb=4096, storage_gb=50)))
    assert (host.capacity.cpus, host.capacity.ram_mb, host.capacity.storage_gb) == (4, 4096, 50)
    assert any("unreachable" in w for w in host.warnings)


@pytest.fixture
def impostor():
    """An HTTP server on loopback that answers GET /v1/host with 200 (or the
    status a test sets) and whatever body a test sets: something at the url,
    but not a fuse agent."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        body, content_type, status = b"", "text/plain", 200

        def do_GET(self):
            self.send_response(Handler.status)
            self.send_header("Content-Type", Handler.content_type)
            self.send_header("Content-Length", str(len(Handler.body)))
            self.end_headers()
            self.wfile.write(Handler.body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Handler.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield Handler
    server.shutdown()
    server.server_close()


FACTS = {"cpus": 4, "ram_mb": 8192, "storage_gb": 100, "arch": "amd64"}


@pytest.mark.parametrize("body,content_type,why", [
    (b"<html><body>It works!</body></html>", "text/html", "is not JSON"),
    (b"[1, 2]", "application/json", "is not a JSON object"),
    (b'{"status": "ok"}', "application/json", "has no valid cpus"),
    (None, "application/json", "has no valid ram_mb"),
    (b'{"cpus": 4, "ram_mb": 8192, "storage_gb": 100, "arch": "amd64", "gpus": "two"}', "application/json",
     "has no valid gpus"),
], ids=["an HTML page", "a JSON list", "JSON without the probe's fields", "a figure that is not a number",
        "a GPU count that is not a number"])
@pytest.mark.parametrize("declared", [False, True], ids=["with fields to probe", "with everything declared"])
def test_rule4_a_url_that_answers_but_is_not_an_agent_is_502_and_stores_nothing(client, impostor, body, content_type,
                                                                                  why, declared):
    import json
    impostor.body = body if body is not None else json.dumps({**FACTS, "ram_mb": "8 GB"}).encode()
    impostor.content_type = content_type
    cap = HostCapacity(vm_count=2, cpus=1, ram_mb=512, storage_gb=1) if declared else HostCapacity(vm_count=2)
    err = api_error(client.hosts.register, RegisterHostRequest(id="impostor", url=impostor.url, token="t", capacity=cap))
    assert (err.status, err.code) == (502, "host_unreachable"), err
    assert err.message.startswith(f"{impostor.url} answered but is not a fuse agent: ") and why in err.message
    assert "\n" not in err.message and err.message.count(". ") == 0
    assert client.hosts.list() == []


NOT_FOUND_PAGE = (b'<!DOCTYPE HTML PUBLIC "-//W3C//DTD HTML 4.01//EN">\n<html><head><title>Error response</title>'
                  b'</head>\n<body><h1>Error response</h1><p>Error code: 404</p></body></html>\n')


@pytest.mark.parametrize("status,body,content_type,said", [
    (404, NOT_FOUND_PAGE, "text/html", "is HTTP 404, not an agent's facts"),
    (404, b'{"error": {"code": "not_found", "message": "no route GET /v1/healthz/v1/host"}}', "application/json",
     'is HTTP 404 ("no route GET /v1/healthz/v1/host"), not an agent\'s facts'),
    (404, b'{"detail": "Not Found"}', "application/json", 'is HTTP 404 ("Not Found"), not an agent\'s facts'),
    (500, b"Internal Server Error", "text/plain", "is HTTP 500, not an agent's facts"),
    (403, b"<html>Forbidden</html>", "text/html", "is HTTP 403, not an agent's facts"),
], ids=["a plain server's 404 page", "a fuse error body's 404", "a FastAPI 404", "a 500", "a 403 page"])
@pytest.mark.parametrize("declared", [False, True], ids=["with fields to probe", "with everything declared"])
def test_rule4_a_url_answering_another_status_is_not_an_agent_and_stores_nothing(client, impostor, status, body,
                                                                                 content_type, said, declared):
    impostor.status, impostor.body, impostor.content_type = status, body, content_type
    cap = HostCapacity(vm_count=2, cpus=1, ram_mb=512, storage_gb=1) if declared else HostCapacity(vm_count=2)
    err = api_error(client.hosts.register, RegisterHostRequest(id="impostor", url=impostor.url, token="t", capacity=cap))
    assert (err.status, err.code) == (502, "host_unreachable"), err
    assert err.message == f"{impostor.url} answered but is not a fuse agent: its reply to GET /v1/host {said}"
    assert client.hosts.list() == []


@pytest.mark.parametrize("status", [502, 503, 504])
def test_rule4_an_agent_saying_it_is_unavailable_is_an_outage(client, impostor, status):
    impostor.status, impostor.content_type = status, "text/html"
    impostor.body = b"<html><body><h1>%d</h1>upstream is down</body></html>" % status
    req = RegisterHostRequest(id="later", url=impostor.url, token="t", capacity=HostCapacity(vm_count=2, cpus=4))
    err = api_error(client.hosts.register, req)
    assert (err.status, err.code) == (502, "host_unreachable") and "storage_gb" in err.message
    assert client.hosts.list() == []
    host = client.hosts.register(req.model_copy(update={"capacity": HostCapacity(vm_count=2, cpus=4, ram_mb=512,
                                                                                 storage_gb=10)}))
    warning = f"probe skipped, host unreachable (the host agent at {impostor.url} answered HTTP {status}); " \
              "registered with the declared capacity"
    assert host.warnings == [warning]


def test_rule4_an_agent_like_reply_with_only_the_probes_fields_registers(client, impostor):
    import json
    impostor.body, impostor.content_type = json.dumps(FACTS).encode(), "application/json"
    host = client.hosts.register(RegisterHostRequest(id="minimal", url=impostor.url, token="t",
                                                     capacity=HostCapacity(vm_count=2)))
    assert (host.capacity.cpus, host.capacity.ram_mb, host.capacity.storage_gb) == (4, 8192, 100)


@pytest.mark.parametrize("declared", [False, True], ids=["with fields to probe", "with everything declared"])
def test_rule4_agent_rejecting_the_token_is_502_unauthorized(client, agent, declared):
    cap = HostCapacity(vm_count=2, cpus=1, ram_mb=512, storage_gb=1) if declared else HostCapacity(vm_count=2)
    err = api_error(reg, client, agent, token="wrong", capacity=cap)
    assert (err.status, err.code) == (502, "unauthorized")
    assert client.hosts.list() == []


@pytest.mark.parametrize("vm_count", [None, 0, -3], ids=["missing", "zero", "negative"])
def test_rule5_vm_count_is_required(client, agent, vm_count):
    body = {"id": "h", "url": agent.url, "token": agent.token, "capacity": {} if vm_count is None else {"vm_count": vm_count}}
    r = client._http.post("/v1/hosts", json=body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument"
    assert "vm_count" in r.json()["error"]["message"]
    assert client.hosts.list() == []


@pytest.mark.parametrize("field,value", [
    ("vm_count", True), ("vm_count", "3"), ("cpus", "4"), ("ram_mb", False), ("vm_count", 3.0), ("gpus", "1"),
], ids=["a boolean vm_count", "a vm_count in a string", "cpus in a string", "a boolean ram_mb",
        "a vm_count with a fraction part", "gpus in a string"])
def test_rule5_capacity_figures_are_json_numbers_never_guessed_from_other_types(client, agent, field, value):
    body = {"id": "h", "url": agent.url, "token": agent.token, "backend": "qemu",
            "capacity": {"vm_count": 3} | {field: value}}
    r = client._http.post("/v1/hosts", json=body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument", r.text
    assert f"capacity.{field}" in r.json()["error"]["message"]
    assert client.hosts.list() == []


@pytest.mark.parametrize("backend,kind", [("qemu", "nvidia-h100"), ("firecracker", "")],
                         ids=["a qemu host takes the probed gpu_kind", "a firecracker host has no gpus to name"])
def test_rule6_gpu_kind_is_probed_on_qemu_hosts_only(client, impostor, backend, kind):
    import json
    impostor.body = json.dumps(FACTS | {"gpus": 1, "gpu_kind": "nvidia-h100"}).encode()
    impostor.content_type = "application/json"
    host = client.hosts.register(RegisterHostRequest(id="g", url=impostor.url, token="t", backend=backend,
                                                     capacity=HostCapacity(vm_count=2)))
    assert host.capacity.gpu_kind == kind and host.capacity.gpus == (1 if backend == "qemu" else 0)


def test_rule12_a_trailing_slash_is_not_another_address(client, agent):
    assert reg(client, agent, url=agent.url + "/").url == agent.url
    host = reg(client, agent, url=agent.url + "//")
    assert host.url == agent.url and client.hosts.get("h1").url == agent.url


def test_rule6_gpu_kind_is_filled_by_the_probe_or_warns_when_it_differs(client, agent):
    real = probed(agent)
    host = reg(client, agent, backend="qemu")
    assert host.capacity.gpu_kind == real["gpu_kind"]
    host = reg(client, agent, id="h2", backend="qemu", capacity=HostCapacity(vm_count=2, gpu_kind="nvidia:H100"))
    assert host.capacity.gpu_kind == "nvidia:H100"
    assert any("gpu_kind" in w and "nvidia:H100" in w for w in host.warnings)


@pytest.mark.parametrize("profiles,ok", [
    ({"1g.10gb": 4}, True), ({"1g.10gb+me": 1, "7g.80gb": 1, "3g.40gb": 2}, True), ({"1c.2g.20gb": 1}, True),
    ({"big": 1}, False), ({"1g10gb": 1}, False), ({"1g.10gb": 0}, False), ({"2g.20gb": -1}, False),
    ({"1g.10gb\n": 1}, False), ({"5g.50gb": 1}, False),
], ids=["one profile", "several profiles and a +me suffix", "a compute-instance profile",
        "an unknown name", "a malformed name", "a zero count", "a negative count",
        "a trailing newline", "a slice count NVML does not have"])
def test_rule7_mig_profiles_are_validated(client, agent, profiles, ok):
    cap = HostCapacity(vm_count=2, mig_profiles=profiles)
    if ok:
        assert reg(client, agent, backend="qemu", capacity=cap).capacity.mig_profiles == profiles
    else:
        err = api_error(reg, client, agent, backend="qemu", capacity=cap)
        assert (err.status, err.code) == (400, "invalid_argument") and "capacity.mig_profiles" in err.message
        assert client.hosts.list() == []


@pytest.mark.parametrize("name", [
    "1g.10gb", "7g.80gb", "8g.192gb", "1c.2g.20gb", "4c.7g.80gb", "1g.10gb+me", "1g.10gb+me,gfx", "4g.40gb+gfx",
    "1g.23gb+me.all", "1g.23gb-me", "1c.1g.10gb+ME",
], ids=lambda n: f"{n} is a profile")
def test_rule7_mig_profile_names_mig_parted_accepts(name):
    from fuse.models.mig import mig_profile_problem
    assert mig_profile_problem(name) is None


@pytest.mark.parametrize("name", [
    "", "1g.10gb\n", " 1g.10gb", "1g.10GB", "1g10gb", "1g.10gb.5", "g.10gb", "1g.gb", "5g.40gb", "9g.90gb",
    "0g.10gb", "5c.7g.80gb", "3c.2g.20gb", "01g.10gb", "1g.010gb", "1g.0gb", "+1g.10gb", "1g.-10gb", "1g.10gb+",
    "1g.10gb+me,", "1g.10gb+me,me", "1g.10gb+m e", "1g.10gb+1me", "1g.10gb+me.", "1g.10gb+.me", "1g.10gb+me-gfx",
    "1g.10gb+m\u00e9", "\u0661g.10gb",
], ids=lambda n: f"{n!r} is not a profile")
def test_rule7_mig_profile_names_mig_parted_refuses(name):
    from fuse.models.mig import mig_profile_problem
    assert mig_profile_problem(name)


def test_rule7_mig_profiles_are_qemu_only(client, agent):
    err = api_error(reg, client, agent, backend="firecracker", capacity=HostCapacity(vm_count=2, mig_profiles={"1g.10gb": 1}))
    assert (err.status, err.code) == (400, "invalid_argument")


def test_rule8_warnings_only_on_the_register_response(client, agent):
    host = reg(client, agent, capacity=HostCapacity(vm_count=2, cpus=999))
    assert host.warnings
    assert client.hosts.get("h1").warnings == [] and client.hosts.list()[0].warnings == []


def test_rule9_list_get_cordon_uncordon_and_deregister(client, agent):
    reg(client, agent, id="a")
    reg(client, agent, id="b")
    assert [h.id for h in client.hosts.list()] == ["a", "b"]
    client.hosts.cordon("a")
    assert client.hosts.get("a").state == "cordoned"
    client.hosts.uncordon("a")
    assert client.hosts.get("a").state == "active"
    client.hosts.deregister("a")
    assert [h.id for h in client.hosts.list()] == ["b"]
    err = api_error(client.hosts.get, "a")
    assert (err.status, err.code) == (404, "not_found")
    assert fuse.is_not_found(err)


def test_rule9_list_pages_walk_every_host_once_in_id_order(client, agent):
    ids = ["a1", "B", "a-2", "_z", "a"]  # orders that collations (en_US and the like) sort differently
    for i in ids:
        reg(client, agent, id=i)
    seen, cursor, pages = [], "", 0
    while True:
        page = client.hosts.list_page(limit=2, cursor=cursor)
        pages += 1
        assert len(page.hosts) <= 2
        seen += [h.id for h in page.hosts]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == sorted(ids) == [h.id for h in client.hosts.list()] and pages == 3
    last = client.hosts.list_page(limit=5)
    assert len(last.hosts) == 5 and last.next_cursor is None


def test_rule9_list_is_in_python_id_order_whatever_order_the_store_returns():
    """PostgreSQL's ORDER BY id follows the database collation (en_US puts
    "a" before "B"); the list and its cursor must agree on one order."""
    from fuse.controller.hosts import HostRegistry

    class CollatedStore:
        def list_hosts(self):
            return [dict(id=i, url="http://h", region="", state="active", backend="qemu", labels={}, capacity={},
                         last_seen=0, created_at=0, updated_at=0, agent_id="") for i in ("_z", "a", "a-2", "a1", "B")]

        def allocated(self):
            return {}

    assert [h.id for h in HostRegistry(CollatedStore()).list()] == ["B", "_z", "a", "a-2", "a1"]


@pytest.mark.parametrize("cursor", ["!!!", "aGk=", "gA", "a", "not a cursor"],
                         ids=["punctuation", "padded base64", "not UTF-8", "truncated", "words"])
def test_rule9_a_cursor_this_server_did_not_issue_is_400(client, agent, cursor):
    reg(client, agent, id="a")
    r = client._http.get("/v1/hosts", params={"limit": 1, "cursor": cursor})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument", r.text
    assert "cursor" in r.json()["error"]["message"]


def test_rule9_list_reports_allocated_figures(client, agent, controller):
    from fuse.controller.store import Store, engine_url, vms
    reg(client, agent, id="a")
    store = Store(engine_url(None, controller.state_dir))
    with store.tx() as c:
        c.execute(vms.insert().values(name="vm-abc", host="a", vcpus=2, mem_mib=512, state="running", record={},
                                      created_at=0))
    host = client.hosts.get("a")
    assert (host.allocated.cpus, host.allocated.ram_mb, host.allocated.vm_count) == (2, 512, 1)
    err = api_error(client.hosts.deregister, "a")
    assert (err.status, err.code) == (409, "conflict")
    assert err.message == "host a still has vm vm-abc assigned"
    assert fuse.is_conflict(err)
    store.close()


def test_rule9_cordon_leaves_a_running_vm_running_and_stops_new_placements(client, tmp_path):
    from support import reap, wait_until
    a = start_agent(tmp_path, backend="fake", name="fake-agent")
    try:
        reg(client, a, id="h1", backend="qemu", capacity=HostCapacity(vm_count=4, cpus=4, ram_mb=4096))
        vm = client.vms.create(shape={"vcpus": 1, "mem_mib": 256}, entry="echo hi", name="job", host="h1")
        assert (vm["host"], vm["state"]) == ("h1", "running")
        on_agent = lambda: httpx.get(f"{a.url}/v1/host/vms/job", headers={"Authorization": f"Bearer {a.token}"}).json()
        pid = on_agent()["pid"]

        client.hosts.cordon("h1")
        assert client.hosts.get("h1").state == "cordoned"
        # The VM keeps running on the host: same process, console still growing.
        offset = client.vms.console("job")["next_offset"]
        wait_until(lambda: client.vms.console("job")["next_offset"] > offset, timeout=10, what="console output")
        assert on_agent()["state"] == "running" and on_agent()["pid"] == pid
        assert os.path.exists(f"/proc/{pid}") and client.vms.get("job")["state"] == "running"
        # ...and nothing new lands there.
        err = api_error(client.vms.create, shape={"vcpus": 1, "mem_mib": 256}, entry="echo hi", name="job2")
        assert err.code == "fleet_full" and "h1" in err.details["hosts"]

        client.hosts.uncordon("h1")
        assert on_agent()["state"] == "running" and on_agent()["pid"] == pid
        client.vms.delete("job")
    finally:
        a.stop()
        reap(a.state_dir)


@pytest.mark.parametrize("action", ["cordon", "uncordon", "drain", "deregister", "get"])
def test_rule9_an_unknown_id_is_404_not_found(client, agent, action):
    reg(client, agent, id="known")
    err = api_error(getattr(client.hosts, action), "unknown")
    assert (err.status, err.code) == (404, "not_found") and fuse.is_not_found(err)
    assert "unknown" in err.message
    assert [(h.id, h.state) for h in client.hosts.list()] == [("known", "active")]


def test_rule12_reregistering_replies_200_replaces_token_and_labels_and_keeps_draining(client, controller, tmp_path):
    from fuse.controller.store import Store, engine_url
    port = free_port()
    open_agent = start_agent(tmp_path, token="first-token", name="tok-agent", port=port)
    try:
        body = {"id": "h1", "url": open_agent.url, "token": "first-token", "labels": {"rack": "r1", "tier": "gold"},
                "capacity": {"vm_count": 2}}
        r = client._http.post("/v1/hosts", json=body)
        assert r.status_code == 201, r.text
        client.hosts.drain("h1")
        assert client.hosts.get("h1").state == "draining"

        open_agent.stop()  # the agent's token changes: the same agent (its state) on the same port
        open_agent = start_agent(tmp_path, token="second-token", name="tok-agent", port=port)
        r = client._http.post("/v1/hosts", json={**body, "token": "second-token", "labels": {"rack": "r2"}})
        assert r.status_code == 200, r.text
        assert r.json()["labels"] == {"rack": "r2"} and r.json()["state"] == "draining"
        assert client.hosts.get("h1").state == "draining"
        store = Store(engine_url(None, controller.state_dir))
        try:
            assert store.get_host("h1")["token"] == "second-token"
        finally:
            store.close()
        client.hosts.uncordon("h1")
        assert client.hosts.get("h1").state == "active"
    finally:
        open_agent.stop()


def test_rule10_state_and_last_seen_is_never_refreshed(client, agent):
    import time
    host = reg(client, agent)
    time.sleep(1.2)  # past a poll or two
    again = client.hosts.get("h1")
    assert again.last_seen == host.last_seen and again.state == "active"


@pytest.mark.parametrize("backend", ["qemu", "firecracker"])
def test_rule11_firecracker_release_is_probed_and_declared_values_ignored(client, agent, backend):
    real = probed(agent)
    host = reg(client, agent, backend=backend,
               capacity=HostCapacity(vm_count=2, firecracker="v9.9.9", firecracker_pinned="v9.9.9"))
    if backend == "qemu":
        assert (host.capacity.firecracker, host.capacity.firecracker_pinned) == ("", "")
    else:
        assert (host.capacity.firecracker, host.capacity.firecracker_pinned) == (real["firecracker"], real["firecracker_pinned"])


def test_rule12_reregistering_keeps_state_and_allocations(client, agent, controller):
    from fuse.controller.store import Store, engine_url, vms
    first = reg(client, agent, region="r1")
    client.hosts.cordon("h1")
    store = Store(engine_url(None, controller.state_dir))
    with store.tx() as c:
        c.execute(vms.insert().values(name="vm-1", host="h1", vcpus=1, mem_mib=256, state="running", record={},
                                      created_at=0))
    again = reg(client, agent, region="r2", capacity=HostCapacity(vm_count=9))
    assert again.state == "cordoned" and again.region == "r2" and again.capacity.vm_count == 9
    assert again.allocated.vm_count == 1 and again.created_at == first.created_at
    # Pointing the id at another machine while VMs are assigned there is refused.
    other = start_agent(controller.state_dir.parent, name="agent-other")
    try:
        err = api_error(reg, client, other, region="r3")
        assert (err.status, err.code) == (409, "conflict")
    finally:
        other.stop()
    store.close()


def test_state_survives_a_controller_restart(tmp_path, agent):
    from support import start_controller
    ctl = start_controller(tmp_path, name="ctl-restart")
    with fuse.Client(ctl.url) as c:
        reg(c, agent)
        c.hosts.cordon("h1")
    ctl.stop()
    ctl = start_controller(tmp_path, name="ctl-restart")
    try:
        with fuse.Client(ctl.url) as c:
            assert c.hosts.get("h1").state == "cordoned"
    finally:
        ctl.stop()


def test_seed_004_short_form_and_wire_envelope(client, agent):
    r = client._http.post("/v1/hosts", json={"name": "edge", "addr": str(agent.socket) and f"unix://{agent.socket}"})
    assert r.status_code == 201, r.text
    assert r.json()["capacity"]["vm_count"] == 16
    # no backend field in seed 004: the agent's own, not seed 000's default (firecracker)
    assert (r.json()["backend"], r.json()["warnings"]) == ("qemu", [])
    assert (r.json()["name"], r.json()["addr"]) == ("edge", f"unix://{agent.socket}")  # its own names too
    assert client.hosts.add("edge2", f"unix://{agent.socket}").backend == "qemu"
    r = client._http.post("/v1/hosts", json={"id": "long-form", "url": f"unix://{agent.socket}",
                                             "capacity": {"vm_count": 2}})
    assert r.json()["backend"] == "firecracker" and "the host agent runs qemu" in r.json()["warnings"][0]
    r = client._http.post("/v1/hosts/edge", params={"action": "explode"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument"
    r = client._http.post("/v1/hosts", json={"name": "x", "addr": "not an address"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument"
