"""Host registry, from a thirty-third review on real controllers and agents: a host name
with an empty label, a label over 63 characters or an `xn--` label that is no IDNA was a
500 (the resolver's UnicodeError, httpx's IDNAError) on http://, and stored for ever
unreachable on mutual TLS; a re-registration on declared capacity could not clear GPUs,
gpu_kind, mig_profiles or arch an earlier one had declared; a declared gpu_kind and arch
had no bound and took a NUL."""

from __future__ import annotations

import asyncio
import os

import pytest

import fuse
from fuse import HostCapacity, RegisterHostRequest
from fuse.transport import greeting, normalise_address, speaks_tls
from support import api_error, start_agent

# ports of this file's own (nothing listens on DOWN: an agent that is not running)
AGENT_PORT, DOWN = 23510, 23550
DECLARED = {"vm_count": 2, "cpus": 2, "ram_mb": 1024, "storage_gb": 10}
LONG = "a" * 64


def register(client, host_id: str, url: str, backend: str = "qemu", token: str = "t", **cap):
    return client.hosts.register(RegisterHostRequest(
        id=host_id, url=url, token=token, backend=backend,
        capacity=HostCapacity.model_validate({**DECLARED, **cap})))


@pytest.mark.parametrize("url,host", [
    (f"http://a..b:{DOWN}", "a..b"), (f"http://.a:{DOWN}", ".a"), (f"http://a..:{DOWN}", "a.."),
    (f"http://{LONG}:{DOWN}", LONG), (f"http://xn--:{DOWN}", "xn--"), (f"https://xn--zz.a:{DOWN}", "xn--zz.a"),
    (f"a..b:{DOWN}", "a..b"), (f".a:{DOWN}", ".a"), (f"xn--:{DOWN}", "xn--"), ("ssh://u@a..b", "a..b")])
def test_a_host_name_that_cannot_be_one_is_400_before_anything_is_stored(client, url, host):
    # declared capacity and not: neither dials (was 500 internal, UnicodeError or IDNAError,
    # on http://; 201 and for ever disconnected on mutual TLS with the three declared)
    for cap in (DECLARED, {"vm_count": 2}):
        err = api_error(client.hosts.register, RegisterHostRequest(
            id="lab", url=url, token="t", backend="qemu", capacity=HostCapacity.model_validate(cap)))
        assert (err.status, err.code) == (400, "invalid_argument"), err
        assert f"address {url!r} is not valid" in err.message and f"{host!r} is not a host name" in err.message, err
    assert client.hosts.list() == []


def test_a_name_that_is_one_is_still_an_address():
    # (one dot at the end is the root's; an internationalised name, and its A-label, are names)
    for url in ("http://a.:8090", "http://bücher.de:8090", "http://xn--bcher-kva.de:8090",
                f"http://{'a' * 63}.b:8090", "http://a_b.lab:8090", "lab.example:8443"):
        assert normalise_address(url) == url


def test_the_probes_look_at_a_name_the_resolver_refuses_is_no_answer_not_an_error():
    # (greeting is how a failed probe tells a wrong address from an outage: its UnicodeError
    # was the 500; a row stored before the address check must fail as unreachable)
    async def look():
        return [await greeting(h, DOWN) for h in ("a..b", ".a", LONG)] + [await speaks_tls("a..b", DOWN)]

    assert asyncio.run(look()) == [b"", b"", b"", False]


@pytest.mark.parametrize("url", ["http://a..b:8080", "http://.a:8080", f"http://{LONG}:8080", "http://xn--:8080"])
def test_the_sdk_refuses_such_a_url_where_the_client_is_made(url):
    # (was: made, and a bare UnicodeError from the first call)
    with pytest.raises(ValueError) as info:
        fuse.Client(url, token="x")
    assert url in str(info.value) and not isinstance(info.value, UnicodeError), info.value


def test_a_reregistration_on_declared_capacity_replaces_what_was_declared_before(client):
    url = f"http://127.0.0.1:{DOWN}"  # (the agent is not running: the probe is skipped)
    first = register(client, "sticky", url, gpus=4, gpu_kind="nvidia:H100", mig_profiles={"1g.10gb": 7},
                     arch="arm64")
    assert any("probe skipped" in w for w in first.warnings), first.warnings
    register(client, "sticky", url)
    cap = client.hosts.get("sticky").capacity
    # (was: 4, 'nvidia:H100', {'1g.10gb': 7}, 'arm64': kept, though no agent ever reported them)
    assert (cap.gpus, cap.gpu_kind, cap.mig_profiles or {}, cap.arch) == (0, "", {}, ""), cap


@pytest.fixture
def gpu_agent(tmp_path):
    """An agent whose machine has an A100 by its nvidia-smi (a stand-in first on PATH)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(
        '#!/bin/sh\necho "NVIDIA A100-SXM4-80GB, GPU-aaaa, 00000000:07:00.0, 81920, 535.104.05, Disabled"\n')
    (bin_dir / "nvidia-smi").chmod(0o755)
    agent = start_agent(tmp_path, backend="fake", name="a1", port=AGENT_PORT,
                        env={"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"})
    yield agent
    agent.stop()


def test_what_the_agent_reported_stands_through_declared_registrations(client, gpu_agent):
    probed = register(client, "g1", gpu_agent.url, token=gpu_agent.token).capacity
    assert (probed.gpus, probed.gpu_kind) == (1, "nvidia:A100") and probed.arch, probed
    gpu_agent.stop()
    # declared over what the agent reported, while it is down: the declared values are stored
    register(client, "g1", gpu_agent.url, token=gpu_agent.token, gpus=3, gpu_kind="nvidia:H100",
             arch="riscv64", mig_profiles={"1g.10gb": 2})
    cap = client.hosts.get("g1").capacity
    assert (cap.gpus, cap.gpu_kind, cap.arch, cap.mig_profiles) == (3, "nvidia:H100", "riscv64", {"1g.10gb": 2})
    # and left out again: what the agent reported comes back, not what was declared
    register(client, "g1", gpu_agent.url, token=gpu_agent.token)
    cap = client.hosts.get("g1").capacity
    assert (cap.gpus, cap.gpu_kind, cap.arch, cap.mig_profiles or {}) == (1, "nvidia:A100", probed.arch, {}), cap
    assert [d.uuid for d in cap.gpu_devices] == ["GPU-aaaa"]


@pytest.mark.parametrize("field,value,said", [
    ("gpu_kind", "x" * 256, "capacity.gpu_kind is longer than 255 characters"),
    ("arch", "x" * 256, "capacity.arch is longer than 255 characters"),
    ("gpu_kind", "x\x00", "capacity.gpu_kind contains a NUL character"),
    ("arch", "riscv\x0064", "capacity.arch contains a NUL character")],
    ids=["gpu_kind-long", "arch-long", "gpu_kind-nul", "arch-nul"])
def test_a_declared_gpu_kind_or_arch_is_bounded_and_takes_no_nul(client, field, value, said):
    # (was: 201 with 500,000 characters of each, sent with every host list; a NUL stored as given)
    err = api_error(register, client, "h1", f"http://127.0.0.1:{DOWN}", **{field: value})
    assert (err.status, err.code) == (400, "invalid_argument") and said in err.message, err
    assert client.hosts.list() == []
    host = register(client, "h1", f"http://127.0.0.1:{DOWN}", **{field: "x" * 255})
    assert getattr(host.capacity, field) == "x" * 255
