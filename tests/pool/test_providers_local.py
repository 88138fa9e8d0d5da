"""The local provider: machines are real `fuse host serve` processes on
loopback. Fake-backend agents for the lifecycle; one real QEMU VM to show a
terminated machine leaves no VM process behind."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from fuse.agent.backends.base import pids_mentioning
from fuse.agent.probe import arch
from fuse.controller.pool.providers import LocalProvider, Machine, link, public_options
from fuse.errors import Conflict, InvalidArgument
from support import real_bundle_dir, reap

TOKEN = "local-agent-token"


@pytest.fixture
def state(tmp_path) -> Path:
    return tmp_path / "cloud"


@pytest.fixture
async def make(state):
    """Factory for providers over one state dir; every machine they know of
    is terminated afterwards, and anything left under the dir killed."""
    made: list[LocalProvider] = []

    def make_(options: dict | None = None) -> LocalProvider:
        made.append(p := link("local", "dev", {"backend": "fake", **(options or {})}, state))
        return p

    yield make_
    for p in made:
        for d in state.glob("*/machine.json"):
            await p.terminate(d.parent.name)
        await p.close()
    reap(state)


async def wait_state(p: LocalProvider, machine_id: str, want: str, timeout: float = 60) -> Machine:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = (await p.describe([machine_id]))[machine_id]
        if m.state == want:
            return m
        await asyncio.sleep(0.1)
    log = (p.state_dir / machine_id / "agent.log")
    raise TimeoutError(f"{machine_id} not {want}: {m}; log: {log.read_text()[-800:] if log.exists() else ''}")


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("options, field", [
    ({"colour": "blue"}, "colour"),
    ({"backend": "firecracker"}, "backend"),
    ({"vm_count": 0}, "vm_count"),
    ({"region": ""}, "region"),
    ({"bundle_dir": "/nonexistent/bundle"}, "bundle_dir"),
    ({"types": []}, "types"),
    ({"types": [{"name": "x", "vcpus": 1, "mem_mib": 512}]}, "types[0].usd_per_hour"),
    ({"types": [{"name": "x", "vcpus": 0, "mem_mib": 512, "usd_per_hour": 0}]}, "types[0].vcpus"),
    ({"types": [{"name": "x/y", "vcpus": 1, "mem_mib": 512, "usd_per_hour": 0}]}, "types[0].name"),
    ({"types": [{"name": "x", "vcpus": 1, "mem_mib": 512, "usd_per_hour": 0, "gpu": "a100"}]}, "types[0].gpu"),
    # (review 21: 2^63 MiB linked, then every plan was a 500; a 2^52 s step billed nothing)
    ({"types": [{"name": "x", "vcpus": 1, "mem_mib": 2**63, "usd_per_hour": 0}]}, "types[0].mem_mib"),
    ({"types": [{"name": "x", "vcpus": 1, "mem_mib": 512, "usd_per_hour": 1, "billing_step_secs": 2**52}]},
     "types[0].billing_step_secs"),
    ({"types": [{"name": "x", "vcpus": 1, "mem_mib": 512, "usd_per_hour": float("nan")}]}, "types[0].usd_per_hour"),
], ids=["an unknown option is named", "an unknown backend is named", "a zero vm_count is named",
        "an empty region is named", "a bundle_dir without a bundle is named", "an empty type list is named",
        "a type without a price names the field", "a type without vCPUs names the field",
        "a type name with a slash is named", "an unknown type field is named", "a size beyond u32 is named",
        "a billing step beyond u32 is named", "a price that is no number is named"])
def test_link_refuses_bad_options_naming_the_field(options, field, state):
    with pytest.raises(InvalidArgument) as err:
        link("local", "dev", options, state)
    assert field in err.value.message


def test_defaults_offers_and_capacity(state):
    p = link("local", "dev", {}, state)
    assert (p.kind, p.name, p.backend, p.region) == ("local", "dev", "qemu", "local")
    offers = {o.type_name: o for o in p.offers()}
    assert set(offers) == {"local.small", "local.medium"}
    small, medium = offers["local.small"], offers["local.medium"]
    assert (small.vcpus, small.mem_mib, small.usd_per_hour) == (1, 1024, 0.01)
    assert (medium.vcpus, medium.mem_mib, medium.usd_per_hour) == (2, 2048, 0.02)
    assert all(o.provider == "dev" and o.kvm and not o.metal and o.arch == arch() for o in offers.values())
    assert p.capacity("local.medium") == {"vm_count": 8, "cpus": 2, "ram_mb": 2048}
    custom = link("local", "dev", {"vm_count": 3, "region": "lab", "types": [
        {"name": "tiny", "vcpus": 1, "mem_mib": 256, "usd_per_hour": 0, "boot_secs": 2}]}, state)
    assert [(o.type_name, o.region, o.boot_secs) for o in custom.offers()] == [("tiny", "lab", 2)]
    assert custom.capacity("tiny") == {"vm_count": 3, "cpus": 1, "ram_mb": 256}
    assert public_options("local", {"backend": "fake"}) == {"backend": "fake"}


async def test_create_runs_an_agent_that_answers_then_terminate_removes_it(make, state):
    p = make({"vm_count": 3})
    m = await p.create(host_name="elastic-1", type_name="local.small", region="local", agent_token=TOKEN)
    assert m == Machine("elastic-1", "pending")
    rec = json.loads((state / "elastic-1" / "machine.json").read_text())
    assert alive(rec["pid"])
    # The token travels by environment, not on the command line anyone can read.
    assert TOKEN.encode() not in Path(f"/proc/{rec['pid']}/cmdline").read_bytes()

    running = await wait_state(p, "elastic-1", "running")
    assert running.address == f"http://127.0.0.1:{rec['port']}"
    r = httpx.get(running.address + "/v1/host", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert r.status_code == 200
    facts = r.json()
    assert facts["backend"] == "fake" and facts["max_vms"] == 3 and facts["arch"] == arch()
    assert httpx.get(running.address + "/v1/host", timeout=10).status_code == 401

    await p.terminate("elastic-1")
    assert (await p.describe(["elastic-1"]))["elastic-1"] == Machine("elastic-1", "terminated")
    assert not alive(rec["pid"]) and not (state / "elastic-1").exists()
    await p.terminate("elastic-1")  # idempotent
    await p.terminate("never-was")


async def test_describe_unknown_and_crashed_machines_as_terminated(make, state):
    p = make()
    await p.create(host_name="crashy", type_name="local.small", region="", agent_token=TOKEN)
    await wait_state(p, "crashy", "running")
    rec = json.loads((state / "crashy" / "machine.json").read_text())
    os.kill(rec["pid"], 9)
    await wait_state(p, "crashy", "terminated", timeout=10)
    seen = await p.describe(["nobody", "../etc"])
    assert {k: v.state for k, v in seen.items()} == {"nobody": "terminated", "../etc": "terminated"}
    await p.terminate("crashy")  # cleans up what the crash left
    assert not (state / "crashy").exists()


async def test_a_restarted_controller_finds_its_machines_again(make):
    first = make()
    await first.create(host_name="survivor", type_name="local.small", region="local", agent_token=TOKEN)
    running = await wait_state(first, "survivor", "running")
    await first.close()
    second = make()  # a new provider over the same state dir, as after a restart
    assert (await second.describe(["survivor"]))["survivor"] == running
    await second.terminate("survivor")
    assert (await second.describe(["survivor"]))["survivor"].state == "terminated"


async def test_concurrent_creates_get_their_own_ports(make):
    p = make()
    names = [f"burst-{i}" for i in range(3)]
    await asyncio.gather(*(p.create(host_name=n, type_name="local.small", region="local", agent_token=TOKEN)
                           for n in names))
    seen = [await wait_state(p, n, "running") for n in names]
    assert len({m.address for m in seen}) == 3
    await asyncio.gather(*(p.terminate(n) for n in names))
    assert {m.state for m in (await p.describe(names)).values()} == {"terminated"}


async def test_create_refuses_unknown_types_regions_names_and_a_running_twin(make):
    p = make()
    for kwargs, text in (({"type_name": "local.huge", "region": "local"}, "local.huge"),
                         ({"type_name": "local.small", "region": "mars"}, "mars")):
        with pytest.raises(InvalidArgument, match=text):
            await p.create(host_name="h", agent_token=TOKEN, **kwargs)
    with pytest.raises(InvalidArgument, match="host name"):
        await p.create(host_name="../escape", type_name="local.small", region="local", agent_token=TOKEN)
    with pytest.raises(InvalidArgument, match="machine id"):
        await p.terminate("../escape")
    await p.create(host_name="twin", type_name="local.small", region="local", agent_token=TOKEN)
    with pytest.raises(Conflict):
        await p.create(host_name="twin", type_name="local.small", region="local", agent_token=TOKEN)


@pytest.mark.qemu
@pytest.mark.timeout(420)
async def test_terminating_a_machine_leaves_no_qemu_process(make, state):
    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 is not installed")
    bundle = await asyncio.to_thread(real_bundle_dir)
    p = make({"backend": "qemu", "bundle_dir": str(bundle)})
    await p.create(host_name="real-1", type_name="local.medium", region="local", agent_token=TOKEN)
    running = await wait_state(p, "real-1", "running", timeout=120)
    async with httpx.AsyncClient(base_url=running.address, headers={"Authorization": f"Bearer {TOKEN}"},
                                 timeout=120) as http:
        r = await http.post("/v1/host/vms", json={"shape": {"vcpus": 1, "mem_mib": 256}, "entry": "sleep 60"})
        assert r.status_code == 201, r.text
    machine_dir = state / "real-1"
    assert pids_mentioning(f"{machine_dir}/", b"qemu-system"), "the VM's QEMU process should run"

    await p.terminate("real-1")
    assert pids_mentioning(machine_dir, b"qemu-system") == []
    assert not machine_dir.exists()
    assert (await p.describe(["real-1"]))["real-1"].state == "terminated"


async def test_terminating_a_machine_leaves_a_process_of_a_dir_whose_path_ends_with_its_own(make, state, tmp_path):
    # review 35: the machine's processes were found by a substring of their command line, so
    # terminating machine f-1 killed a process of /nest/<state>/f-1 (another cloud's, say)
    import subprocess
    import sys

    p = make()
    await p.create(host_name="f-1", type_name="local.medium", region="local", agent_token=TOKEN)
    await wait_state(p, "f-1", "running")
    other = tmp_path / "nest" / str(state / "f-1").lstrip("/") / "vms" / "a"
    other.mkdir(parents=True)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(other)])
    try:
        await p.terminate("f-1")
        assert bystander.poll() is None, "terminating f-1 killed a process of a dir whose path ends with f-1's"
        assert (await p.describe(["f-1"]))["f-1"].state == "terminated"
    finally:
        bystander.kill()
        bystander.wait()
