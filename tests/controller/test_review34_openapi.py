"""The OpenAPI documents say what the servers answer (review 34): every controller route reads
its store and so may answer 503 db_unavailable (README: "every route"), and a create, delete,
sleep or wake its host carried out while the database was away says so in that 503; the agent's
two raw-bytes move routes are application/octet-stream (a state file's bytes with X-File-Size and
X-Offset, a chunk written as sent), not JSON. Asserted on the documents real processes serve."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess

import httpx
import pytest

from support import Postgres, reap, start_agent, start_controller, wait_until

PORTS = iter(range(41400, 41500))  # (this test's range; inside the kernel's ephemeral one, so tried in turn)
TOKEN = "agent-token"
RAW = "application/octet-stream"


def _port() -> int:
    """The next port of the range that is free now (an outgoing connection may hold one)."""
    for port in PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port left in 41400-41499")


def _uds(p) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(p.socket)), base_url="http://c", timeout=30)


def _ops(doc: dict):
    return [(m, path, op) for path, ops in doc["paths"].items() for m, op in ops.items()]


def _declares_error(op: dict, status: str) -> bool:
    r = op["responses"].get(status)
    return r is not None and r["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}


@pytest.fixture(scope="module")
def controller_doc(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("r34-ctl")
    ctl = start_controller(tmp)
    try:
        with _uds(ctl) as c:
            r = c.get("/openapi.json")
            assert r.status_code == 200, r.text
            yield r.json()
    finally:
        ctl.stop()


def test_every_controller_route_declares_503_db_unavailable(controller_doc):
    ops = _ops(controller_doc)
    assert len(ops) > 30
    missing = [f"{m.upper()} {p}" for m, p, op in ops if not _declares_error(op, "503")]
    assert not missing, f"503 db_unavailable undeclared on: {missing}"
    for m, p, op in ops:
        if p != "/v1/healthz":  # (its own 503, declared where the route is)
            assert op["responses"]["503"]["description"].startswith("db_unavailable: "), (m, p)
            assert "try again" in op["responses"]["503"]["description"], (m, p)


@pytest.mark.parametrize("method,path,details", [
    ("post", "/v1/vms", "host and vm"),
    ("delete", "/v1/vms/{name}", 'host, vm and done ("delete")'),
    ("post", "/v1/vms/{name}/sleep", 'host, vm and done ("sleep")'),
    ("post", "/v1/vms/{name}/wake", 'host, vm and done ("wake")'),
])
def test_a_503_that_says_the_host_did_it_is_declared_with_its_details(controller_doc, method, path, details):
    text = controller_doc["paths"][path][method]["responses"]["503"]["description"]
    assert f"with error.details {details}," in text and "do not ask again" in text, text
    assert "without details" in text and "try again" in text, text  # (and the plain outage beside it)


@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_each_route_a_controller_answers_503_while_its_database_is_away_declares_it(tmp_path):
    """The reviewer's repro: the database stopped, every route is 503 db_unavailable, and the
    served document declares each of those answers (it declared only healthz's)."""
    pg = Postgres()
    for _ in range(5):
        pg.port = _port()
        try:
            pg.start()
            break
        except subprocess.CalledProcessError:  # (its port taken between the check and the bind)
            shutil.rmtree(pg.dir / "data", ignore_errors=True)
    else:
        pg.stop()
        raise RuntimeError("PostgreSQL did not start on a port of 41400-41499")
    ctl = None
    try:
        ctl = start_controller(tmp_path, db=pg.create_db("r34"))
        with _uds(ctl) as c:
            doc = c.get("/openapi.json").json()
            pg.down()
            try:
                got = {}
                for m, path, op in _ops(doc):
                    if m == "get":  # (every read, its path's ids made up; and a create below)
                        r = c.get(re.sub(r"\{[^}]+\}", "x", path))
                        got[(m, path)] = (r.status_code, r.json()["error"]["code"] if r.status_code >= 400 else None)
                r = c.post("/v1/vms", json={"name": "v1", "shape": {"vcpus": 1, "mem_mib": 256}, "entry": "true"})
                got[("post", "/v1/vms")] = (r.status_code, r.json()["error"]["code"])
            finally:
                pg.up()  # (stop() ends a running server)
        assert len(got) > 15
        assert {k: v for k, v in got.items() if v != (503, "db_unavailable")} == {}
        undeclared = [k for k in got if not _declares_error(doc["paths"][k[1]][k[0]], "503")]
        assert not undeclared, f"answered 503 db_unavailable, undeclared: {undeclared}"
    finally:
        if ctl is not None:
            ctl.stop()
        pg.stop()


@pytest.fixture
def agent(tmp_path):
    p = start_agent(tmp_path, backend="fake", token=TOKEN, port=_port())
    yield p
    p.stop()
    reap(tmp_path)


def test_the_agent_documents_its_raw_bytes_routes_as_it_answers_them(agent):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=agent.url, headers=auth, timeout=30) as c:
        doc = c.get("/openapi.json").json()
        read = doc["paths"]["/v1/host/vms/{name}/files/{file}"]["get"]["responses"]["200"]
        write = doc["paths"]["/v1/host/incoming/{move_id}/files/{file}"]["put"]
        assert list(read["content"]) == [RAW], read  # (was: application/json)
        assert {"X-File-Size", "X-Offset"} <= set(read.get("headers", {})), read
        assert list(write.get("requestBody", {}).get("content", {})) == [RAW], write  # (was: no body at all)
        assert "64 MiB" in write["responses"]["413"]["description"]

        # and the real answers: a sleeping VM's state file read, then sent to an incoming move
        r = c.post("/v1/host/vms", json={"name": "ct1", "shape": {"vcpus": 1, "mem_mib": 256}, "entry": "sleep 100"})
        assert r.status_code == 201, r.text
        wait_until(lambda: c.get("/v1/host/vms/ct1").json()["state"] == "running", timeout=30, what="ct1 running")
        assert c.post("/v1/host/vms/ct1/sleep", json={}).status_code == 200
        vm = c.get("/v1/host/vms/ct1").json()
        files = c.get("/v1/host/vms/ct1/files").json()["files"]
        f = files[0]
        r = c.get(f"/v1/host/vms/ct1/files/{f['name']}")
        assert r.status_code == 200 and r.headers["content-type"] == RAW, r.headers
        assert (r.headers["x-file-size"], r.headers["x-offset"]) == (str(f["size"]), "0")
        data = r.content
        assert len(data) == f["size"]

        body = {"move_id": "m34", "vm": {"name": "ct2", "shape": vm["shape"], "entry": "true", "bundle": "linux",
                                         "bundle_fingerprint": vm["bundle_fingerprint"]},
                "platform": vm["platform"], "files": files}
        r = c.post("/v1/host/incoming", json=body)
        assert r.status_code == 201, r.text
        for g in files:
            chunk = c.get(f"/v1/host/vms/ct1/files/{g['name']}").content
            r = c.put(f"/v1/host/incoming/m34/files/{g['name']}", content=chunk, headers={"content-type": RAW})
            assert r.status_code == 200, r.text
            assert str(r.status_code) in write["responses"]
        assert c.post("/v1/host/incoming/m34/verify").status_code == 200
        assert c.delete("/v1/host/incoming/m34").status_code == 204
        assert c.delete("/v1/host/vms/ct1").status_code == 204
