"""Registering and addressing hosts, from an eighteenth review on real controllers and
agents: a lone UTF-16 surrogate (JSON's ``"\\udfff"``) in a label was stored behind a
500, and every host list failed after it; a path id ending in ``%0A`` reached the host
without it (a DELETE removed it), and escapes that are not UTF-8 reached the host
named U+FFFD; the SDK's ``hosts.get(".")`` read the host list as one empty host; MIG
counts, labels and tokens had no bound; a probe answering 0 was stored without a word.
(The registry's 409 for a create under way now names the VM: test_host_ties.)"""

from __future__ import annotations

import json
import httpx
import pytest

import fuse
from fuse import HostCapacity, RegisterHostRequest
from support import api_error, refused
from test_registry import FACTS, impostor  # noqa: F401  (the fixture: something answering GET /v1/host)


@pytest.fixture
def http(tmp_path):
    from support import start_controller

    c = start_controller(tmp_path, listen=True, token="r18-token")
    with httpx.Client(base_url=f"http://127.0.0.1:{c.extra['port']}",
                      headers={"Authorization": "Bearer r18-token"}, timeout=30) as h:
        h.ctl = c
        yield h
    c.stop()


def register_raw(http, agent, text: str) -> httpx.Response:
    """POST /v1/hosts with the body's JSON text as given (escapes kept)."""
    body = '{"id": "h1", "url": "%s", "token": "%s", "capacity": {"vm_count": 2}, %s}' % (
        agent.url, agent.token, text)
    return http.post("/v1/hosts", content=body.encode(), headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("text,where", [
    ('"labels": {"k": "\\udfff"}', "labels.k"),
    ('"labels": {"\\udfff": "v"}', "labels: the key \\udfff"),
    ('"region": "\\ud800east"', "region"),
    ('"backend": "qemu\\udc00"', "backend"),
])
def test_a_lone_surrogate_anywhere_in_a_body_is_400_and_nothing_is_stored(http, agent, text, where):
    r = register_raw(http, agent, text)
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), r.text
    assert where in refused(r) and "lone UTF-16 surrogate" in refused(r), r.text
    listing = http.get("/v1/hosts")
    assert listing.status_code == 200 and listing.json()["hosts"] == [], listing.text
    # a surrogate pair is one character: registers as any text does
    r = register_raw(http, agent, '"labels": {"k": "\\ud83d\\ude00"}')
    assert r.status_code == 201, r.text
    assert http.get("/v1/hosts/h1").json()["labels"] == {"k": "\U0001F600"}


def test_the_sdk_sends_a_lone_surrogate_for_the_server_to_refuse(client, agent):
    err = api_error(client.hosts.register, RegisterHostRequest(
        id="h1", url=agent.url, token=agent.token, labels={"k": "\udfff"}, capacity=HostCapacity(vm_count=1)))
    assert (err.status, err.code) == (400, "invalid_argument") and "labels.k" in err.message, err
    assert client.hosts.list() == []


def test_a_path_with_a_control_character_or_bad_utf8_is_400_and_touches_no_host(http, agent):
    for hid in ("x", "\ufffd"):
        r = http.post("/v1/hosts", json={"id": hid, "url": agent.url, "token": agent.token,
                                         "capacity": {"vm_count": 1}})
        assert r.status_code == 201, r.text
    for method, path in [("GET", "/v1/hosts/x%0A"), ("POST", "/v1/hosts/x%0A?action=cordon"),
                         ("DELETE", "/v1/hosts/x%0A"), ("DELETE", "/v1/hosts/x%0D"), ("GET", "/v1/vms/a%0A"),
                         ("DELETE", "/v1/hosts/%FF"), ("POST", "/v1/hosts/%C0?action=cordon"),
                         ("GET", "/v1/hosts/%ED%B3%BF")]:
        r = http.request(method, path)
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), (method, path, r.text)
        assert "no name here holds one" in refused(r), r.text
    assert sorted((h["id"], h["state"]) for h in http.get("/v1/hosts").json()["hosts"]) == [
        ("x", "active"), ("\ufffd", "active")]
    assert http.get("/v1/hosts/%EF%BF%BD").json()["id"] == "\ufffd"  # U+FFFD spelt in UTF-8 reaches it
    r = httpx.get(f"http://127.0.0.1:{http.ctl.extra['port']}/v1/hosts/x%0A", timeout=30)
    assert r.status_code == 401  # the token still comes first


def test_the_agent_refuses_such_paths_too(agent):
    r = httpx.get(agent.url + "/v1/host/vms/a%0A", headers={"Authorization": f"Bearer {agent.token}"}, timeout=30)
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), r.text


@pytest.mark.parametrize("asynchronous", [False, True])
def test_sdk_dot_ids_are_sent_as_ids_not_dot_segments(client, controller, agent, asynchronous):
    client.hosts.register(RegisterHostRequest(id="x", url=agent.url, token=agent.token,
                                              capacity=HostCapacity(vm_count=1)))
    calls = ["get", "cordon", "uncordon", "deregister"]
    if asynchronous:
        import asyncio

        async def run():
            out = []
            async with fuse.AsyncClient(controller.url) as ac:
                for name in calls:
                    for hid in (".", ".."):
                        try:
                            await getattr(ac.hosts, name)(hid)
                            out.append(None)
                        except fuse.ApiError as exc:
                            out.append(exc)
            return out
        errs = asyncio.run(run())
    else:
        errs = [api_error(getattr(client.hosts, name), hid) for name in calls for hid in (".", "..")]
    for err in errs:
        assert err is not None and (err.status, err.code) == (404, "not_found"), err
        assert "host ." in err.message, err.message
    assert [(h.id, h.state) for h in client.hosts.list()] == [("x", "active")]


def test_bounds_on_mig_counts_labels_and_texts(client, agent):
    def refuse(**kw):
        req = dict(id="h1", url=agent.url, token=agent.token, backend="qemu", capacity=HostCapacity(vm_count=1)) | kw
        return api_error(client.hosts.register, RegisterHostRequest(**req))

    err = refuse(capacity=HostCapacity(vm_count=1, mig_profiles={"1g.10gb": 2**53 + 1}))
    assert (err.status, err.code) == (400, "invalid_argument") and "at most 9007199254740992" in err.message, err
    err = refuse(labels={f"k{i}": "v" for i in range(129)})
    assert err.code == "invalid_argument" and "at most 128 labels" in err.message, err
    err = refuse(labels={"rack": "v" * 1025})
    assert err.code == "invalid_argument" and "labels.rack is longer than 1024" in err.message, err
    err = refuse(labels={"k" * 256: "v"})
    assert err.code == "invalid_argument" and "longer than 255" in err.message, err
    err = refuse(token="t" * 4097)
    assert (err.status, err.code) == (400, "invalid_argument") and "token is longer than 4096" in err.message, err
    err = refuse(region="r" * 256)
    assert err.code == "invalid_argument" and "region is longer than 255" in err.message, err
    assert client.hosts.list() == []
    # at the bounds: registers
    host = client.hosts.register(RegisterHostRequest(
        id="h1", url=agent.url, token=agent.token, backend="qemu", region="r" * 255,
        labels={f"k{i}": "v" * 1024 for i in range(128)}, capacity=HostCapacity(vm_count=1)))
    assert len(host.labels) == 128 and len(host.region) == 255


def test_a_probe_answering_0_is_stored_with_a_warning(client, impostor):
    impostor.body, impostor.content_type = json.dumps(FACTS | {"storage_gb": 0}).encode(), "application/json"
    host = client.hosts.register(RegisterHostRequest(id="tiny", url=impostor.url, token="t",
                                                     capacity=HostCapacity(vm_count=1)))
    assert host.capacity.storage_gb == 0 and host.capacity.cpus == FACTS["cpus"]
    assert [w for w in host.warnings if w.startswith("capacity.storage_gb: the host agent probed 0")], host.warnings
    assert not [w for w in host.warnings if w.startswith("capacity.cpus")], host.warnings
    # declared: kept, with the overcommit warning alone
    host = client.hosts.register(RegisterHostRequest(id="tiny2", url=impostor.url, token="t",
                                                     capacity=HostCapacity(vm_count=1, storage_gb=5)))
    assert host.capacity.storage_gb == 5
    assert [w for w in host.warnings if "storage_gb" in w] == [
        "capacity.storage_gb: declared 5 exceeds probed 0; keeping the declared value"], host.warnings


def test_probed_mig_entries_dropped_are_said_only_when_the_probe_is_used(client, impostor):
    facts = FACTS | {"gpus": 1, "gpu_kind": "A100", "mig_profiles": {"weird.name": 1, "1g.10gb": 2},
                     "backend": "qemu"}
    impostor.body, impostor.content_type = json.dumps(facts).encode(), "application/json"
    probed = client.hosts.register(RegisterHostRequest(id="g1", url=impostor.url, token="t", backend="qemu",
                                                       capacity=HostCapacity(vm_count=1)))
    assert probed.capacity.mig_profiles == {"1g.10gb": 2}
    assert [w for w in probed.warnings if "dropped the probed entry 'weird.name'" in w], probed.warnings
    declared = client.hosts.register(RegisterHostRequest(id="g2", url=impostor.url, token="t", backend="qemu",
                                                         capacity=HostCapacity(vm_count=1,
                                                                               mig_profiles={"1g.10gb": 1})))
    assert declared.capacity.mig_profiles == {"1g.10gb": 1}
    assert not [w for w in declared.warnings if "mig" in w], declared.warnings


@pytest.mark.parametrize("token,what", [("s3cret-tok\n", "a newline"), (" s3cret-tok", "a space"),
                                        ("s3cret-tök", "a non-ASCII character")])
@pytest.mark.parametrize("declared", [False, True], ids=["probed", "declared"])
def test_an_agent_token_no_header_can_hold_is_400_and_never_quoted(client, agent, token, what, declared):
    """The HTTP library's refusal quoted the header (``Illegal header value b'Bearer ...'``): the
    token came back in the 502, or (all declared) in the warning, the disconnect event and usage."""
    cap = HostCapacity(vm_count=1, cpus=1, ram_mb=512, storage_gb=1) if declared else HostCapacity(vm_count=1)
    err = api_error(client.hosts.register, RegisterHostRequest(id="h1", url=agent.url, token=token, capacity=cap))
    assert (err.status, err.code) == (400, "invalid_argument"), err
    assert err.message.startswith(f"token holds {what}: a bearer token is visible ASCII"), err.message
    assert "s3cret" not in err.message
    assert client.hosts.list() == []
    assert "s3cret" not in json.dumps(client.events.list(0, limit=500))


def test_the_sdk_and_the_servers_refuse_such_a_token_without_quoting_it(tmp_path):
    import subprocess
    import sys

    with pytest.raises(ValueError) as e:
        fuse.Client("http://127.0.0.1:9", token="s3cret\n")
    assert "holds a newline" in str(e.value) and "s3cret" not in str(e.value)
    for args in (["host", "serve", "--listen", "127.0.0.1:1", "--state-dir", str(tmp_path / "a")],
                 ["controller", "serve", "--listen", "127.0.0.1:1", "--state-dir", str(tmp_path / "c"),
                  "--socket", str(tmp_path / "c.sock")]):
        r = subprocess.run([sys.executable, "-m", "fuse.cli", *args, "--token", "s3cret tok"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and "holds a space" in r.stderr and "s3cret" not in r.stderr, r.stderr
