"""Elastic hosts as a black-box review found them (review 18): a host a controller left
``creating`` when it stopped in the cloud's create call is settled once that controller's
lease on it runs out — the cloud is asked for the machine started under its name (the
local provider's dir, AWS's ``Name`` tag), which is terminated, and the host is ``gone``,
no longer counted in the budget — and ``cloud_remove_host`` takes each name once.

A real controller stopped with SIGKILL and started again over a ``local`` cloud of real
host agents; the AWS provider against the moto EC2 server of ``test_providers_aws``,
with the controller app in process (its passes run by hand, as ``test_review16_aws``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest
from sqlalchemy import insert, update
from test_providers_aws import SECRET, ami, ec2, provider  # noqa: F401 (fixtures)
from test_review4_caps import app  # noqa: F401 (the fixture: a controller app, its machines removed after)

import fuse
from fuse.agent.backends.base import pids_mentioning
from fuse.controller.pool.providers import link
from fuse.controller.service import Controller
from fuse.controller.store import elastic_hosts as hosts_t
from support import start_controller, wait_until

SMALL = {"name": "local.small", "vcpus": 2, "mem_mib": 2048, "usd_per_hour": 0.36}
LEASE = {"FUSE_POOL_CREATE_LEASE_S": "2"}


def left_creating(store, name: str, cloud: str, type_name: str, region: str, token: str = "tok-0123") -> None:
    """The row a controller stopped in ``cloud_add_host`` leaves: ``creating``, no cloud id."""
    now = time.time()
    with store.tx() as c:
        c.execute(insert(hosts_t).values(
            name=name, provider=cloud, type_name=type_name, region=region, cloud_id="", state="creating",
            started=now - 5, ended=None, expires=int(now + 3600), usd_per_hour=0.36, billing_step_secs=1,
            billing_min_secs=60, boot_secs=1, pinned=1, token=token,
            record={"history": [{"state": "creating", "time": now - 5, "reason": ""}], "planned_until": now - 5},
            updated_at=now - 5))


def host(client, name: str) -> fuse.ElasticHost:
    (h,) = [h for h in client.pool.cloud_hosts(include_gone=True) if h.name == name]
    return h


@pytest.mark.timeout(180)
def test_a_host_left_creating_by_a_stopped_controller_is_settled_and_its_machine_terminated(tmp_path, procs):
    machines = tmp_path / "machines"
    options = {"backend": "fake", "dir": str(machines), "types": [SMALL]}
    procs.append(ctl := start_controller(tmp_path, env=LEASE))
    with fuse.Client(ctl.url) as client:
        client.pool.link_cloud("dev", "local", options)
    ctl.kill()
    # what the stopped controller left: dev-1's machine started (its id never stored), dev-2 not yet
    c = Controller(ctl.state_dir)
    left_creating(c.store, "dev-1", "dev", "local.small", "local")
    left_creating(c.store, "dev-2", "dev", "local.small", "local")
    c.store.close()
    cloud = link("local", "dev", options, tmp_path / "unused")
    asyncio.run(cloud.create(host_name="dev-1", type_name="local.small", region="local", agent_token="tok-0123"))
    agent = cloud._children["dev-1"]
    assert agent.poll() is None and (machines / "dev-1").is_dir()

    procs.append(ctl := start_controller(tmp_path, env=LEASE))
    with fuse.Client(ctl.url) as client:
        wait_until(lambda: {host(client, n).state for n in ("dev-1", "dev-2")} == {"gone"}, timeout=30,
                   interval=0.2, what="dev-1 and dev-2 settled")
        wait_until(lambda: agent.poll() is not None, timeout=15, what="dev-1's agent ended")
        assert not (machines / "dev-1").exists() and not pids_mentioning(f"{machines}/dev-1/")
        gone = {e["host"]: e["reason"] for e in client.events.list(0, limit=500)["events"]
                if e["type"] == "elastic_host" and e.get("to") == "gone"}
        assert "its machine dev-1, found by its name, is terminated" in gone["dev-1"], gone
        assert "the cloud has no machine of its name" in gone["dev-2"], gone
        budget = client.pool.cloud_budget(fuse.ElasticBudgetUpdate())
        assert (budget.hosts, budget.running_usd_per_hour) == (0, 0.0), budget
        assert client.pool.cloud_hosts() == []
        # the pool buys again, and names on: a host it adds now is its own create's
        (added,) = client.pool.cloud_add_host("dev", "local.small", ttl_hours=1)
        assert added.name == "dev-3" and added.state == "booting"
        assert client.pool.cloud_remove_host(["dev-3"]).removed == ["dev-3"]


@pytest.mark.timeout(180)
def test_a_controller_killed_in_cloud_add_host_leaves_no_machine_unseen_once_started_again(tmp_path, procs):
    machines = tmp_path / "machines"
    procs.append(ctl := start_controller(tmp_path, env=LEASE))
    client = fuse.Client(ctl.url)
    client.pool.link_cloud("dev", "local", {"backend": "fake", "dir": str(machines), "types": [SMALL]})

    def add() -> None:
        with contextlib.suppress(Exception):  # (its controller is killed under it)
            client.pool.cloud_add_host("dev", "local.small", count=5, ttl_hours=1)

    adding = threading.Thread(target=add, daemon=True)
    adding.start()
    wait_until(lambda: (machines / "dev-1" / "machine.json").exists(), timeout=30, interval=0.001,
               what="dev-1's machine started")
    ctl.kill()
    adding.join(10)
    client.close()

    procs.append(ctl := start_controller(tmp_path, env=LEASE))
    with fuse.Client(ctl.url) as client:
        wait_until(lambda: all(h.state != "creating" for h in client.pool.cloud_hosts(include_gone=True)),
                   timeout=30, interval=0.2, what="no host left creating")
        live = {h.name for h in client.pool.cloud_hosts()}
        wait_until(lambda: {d.name for d in machines.iterdir()} == live, timeout=20,
                   what=f"only the machines of {sorted(live)} left")
        budget = client.pool.cloud_budget(fuse.ElasticBudgetUpdate())
        assert budget.hosts == len(live) and budget.running_usd_per_hour == pytest.approx(0.36 * len(live))
        client.pool.cloud_remove_host(sorted(live))


def aws_left_creating(ctl, ec2, ami, subnet: str, name: str, fresh: bool = False) -> str:  # noqa: F811
    """A ``creating`` row of cloud ``aws1`` and the instance its create started (tagged as the
    provider tags it, in its ``subnet``); ``fresh``: its lease renewed a moment ago (a live replica
    creating it)."""
    left_creating(ctl.store, name, "aws1", "m7i.large", "us-west-2")
    if fresh:
        with ctl.store.tx() as c:
            c.execute(update(hosts_t).where(hosts_t.c.name == name).values(updated_at=time.time()))
    tags = [{"Key": "Name", "Value": name}, {"Key": "fuse-pool", "Value": "aws1"}]
    reply = ec2.run_instances(ImageId=ami, InstanceType="m7i.large", MinCount=1, MaxCount=1, SubnetId=subnet,
                              TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])
    return reply["Instances"][0]["InstanceId"]


def state_of(ec2, instance_id: str) -> str:  # noqa: F811
    return ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]["State"]["Name"]


def test_an_aws_host_left_creating_is_found_by_its_name_tag_and_terminated(app, moto_url, moto_subnet,  # noqa: F811
                                                                           ami, ec2, monkeypatch):
    client, ctl = app
    r = client.put("/v1/pool/clouds/aws1", json={"kind": "aws", "options": {
        "image_id": ami, "endpoint_url": moto_url, "access_key_id": "k", "secret_access_key": SECRET,
        "subnet_id": moto_subnet}})
    assert r.status_code == 200, r.text
    ticked = aws_left_creating(ctl, ec2, ami, moto_subnet, "aws1-1")
    removed = aws_left_creating(ctl, ec2, ami, moto_subnet, "aws1-2")
    live = aws_left_creating(ctl, ec2, ami, moto_subnet, live_name := "aws1-3", fresh=True)
    # (the rows were last renewed 5 s ago, or now)
    monkeypatch.setattr("fuse.controller.pool.elastic.CREATE_LEASE_SECS", 4.0, raising=False)
    with ctl.store.tx() as c:  # (renewed again just before: on a loaded machine the moto calls
        # above took longer than the lease, and the live replica's row read as abandoned)
        c.execute(update(hosts_t).where(hosts_t.c.name == live_name).values(updated_at=time.time()))
    # cloud_remove_host settles one at once; another replica's live create is still refused
    r = client.post("/v1/pool/hosts/remove", json={"names": ["aws1-2", "aws1-3"]})
    assert r.json()["removed"] == ["aws1-2"], r.json()
    assert r.json()["failed"] == ["aws1-3: the cloud is still creating it: remove it once it is booting"]
    asyncio.run(ctl.pool.tick())
    rows = {h["name"]: h for h in client.get("/v1/pool/hosts?all=true").json()["hosts"]}
    assert (rows["aws1-1"]["state"], rows["aws1-1"]["id"]) == ("gone", ticked)
    assert (rows["aws1-2"]["state"], rows["aws1-2"]["id"]) == ("gone", removed)
    assert rows["aws1-3"]["state"] == "creating"
    assert {state_of(ec2, ticked), state_of(ec2, removed)} <= {"shutting-down", "terminated"}
    assert state_of(ec2, live) in ("pending", "running")
    ec2.terminate_instances(InstanceIds=[live])


async def test_the_aws_provider_finds_the_machines_a_create_started_under_a_host_name(provider):  # noqa: F811
    m = await provider.create(host_name="find-1", type_name="t3.medium", region="us-west-2",
                              agent_token="agent-token-Zq9")
    assert [x.id for x in await provider.find("find-1")] == [m.id]
    assert await provider.find("find-2") == []
    await provider.terminate(m.id)
    assert await provider.find("find-1") == []


@pytest.mark.timeout(120)
def test_cloud_remove_host_takes_each_name_once(tmp_path, procs):
    procs.append(ctl := start_controller(tmp_path))
    with fuse.Client(ctl.url) as client:
        client.pool.link_cloud("dev", "local", {"backend": "fake", "types": [SMALL]})
        (h,) = client.pool.cloud_add_host("dev", "local.small", ttl_hours=1)
        out = client.pool.cloud_remove_host([h.name, "ghost", h.name])
        assert out.removed == [h.name] and out.failed == ["ghost: not a host this pool added"], out
