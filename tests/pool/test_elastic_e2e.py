"""The elastic pool end to end: a real controller process, a linked `local` cloud whose
machines are real host agents on loopback (the fake VM backend: this file is about
buying, joining, budgets and scale-in; test_prewarm_real.py boots real VMs), driven
through the SDK."""

from __future__ import annotations

import json
import time

import pytest

import fuse
from support import reap, start_controller, wait_until

TYPES = [{"name": "local.small", "vcpus": 1, "mem_mib": 1024, "usd_per_hour": 0.36},
         {"name": "local.big", "vcpus": 4, "mem_mib": 8192, "usd_per_hour": 1.44}]


@pytest.fixture
def pool(tmp_path):
    ctl = start_controller(tmp_path)
    client = fuse.Client(ctl.url)
    client._send(fuse_call("PUT", "/v1/pool/clouds/dev", {"kind": "local", "options": {"backend": "fake",
                                                                                       "types": TYPES}}))
    yield client, ctl
    for h in client.pool.cloud_hosts():  # nothing may outlive the test: no agent process, no machine
        for vm in client._send(fuse_call("GET", f"/v1/vms?host={h.name}"))["vms"]:
            try:
                client._send(fuse_call("DELETE", f"/v1/vms/{vm['name']}?host={h.name}"))
            except fuse.ApiError as e:  # gone meanwhile (a removed prewarm's VM)
                assert e.status == 404, e
    client.pool.cloud_remove_host([h.name for h in client.pool.cloud_hosts()])
    client.close()
    ctl.stop()
    reap(tmp_path)  # a machine a failed test left behind: its agent runs from under tmp_path


def fuse_call(method, path, body=None):
    from fuse.client._core import Call
    return Call(method, path, body=body)


def joined(client, name, timeout=60.0):
    wait_until(lambda: any(h.name == name and h.state == "joined" for h in client.pool.cloud_hosts()),
               timeout=timeout, what=f"{name} joined")
    return next(h for h in client.pool.cloud_hosts() if h.name == name)


def create_vm(client, **body):
    return client._send(fuse_call("POST", "/v1/vms", {"shape": {"vcpus": 1, "mem_mib": 256}, "entry": "sleep 600",
                                                      **body}))


def test_a_host_added_by_hand_joins_as_a_probed_host_and_goes_when_removed(pool):
    client, _ = pool
    (h,) = client.pool.cloud_add_host("dev", "local.small", ttl_hours=2)
    assert h.name == "dev-1" and h.provider == "dev" and h.type_name == "local.small" and h.pinned
    assert h.state in ("creating", "booting") and h.usd_per_hour == 0.36
    assert h.expires == pytest.approx(h.started + 7200, abs=2)
    h = joined(client, "dev-1")
    assert h.machine == "dev-1" and h.id
    host = client.hosts.get("dev-1")
    assert host.capacity.cpus == 1 and host.capacity.ram_mb == 1024  # the type's size, declared at join
    assert client.pool.cloud_budget().running_usd_per_hour == pytest.approx(0.36)
    removed = client.pool.cloud_remove_host(["dev-1", "nope"])
    assert removed.removed == ["dev-1"] and removed.failed == ["nope: not a host this pool added"]
    assert client.pool.cloud_hosts() == []
    with pytest.raises(fuse.ApiError) as e:
        client.hosts.get("dev-1")
    assert e.value.status == 404
    budget = client.pool.cloud_budget()
    assert budget.hosts == 0 and budget.running_usd_per_hour == 0 and budget.month_usd > 0


def test_a_hand_added_host_with_room_is_used_before_a_new_machine_is_bought(pool):
    # seed 001's order: hosts with room before new cloud machines. A hand-added host
    # is paid until its TTL whatever it runs, so work there adds nothing to the bill
    # (a new local.small, half its price an hour, looked cheaper before).
    client, _ = pool
    client.pool.cloud_add_host("dev", "local.big", ttl_hours=1)
    joined(client, "dev-1")
    plan = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=2, cpus=1, memory_mb=256, duration_secs=600))
    assert [(a.host, a.count) for a in plan.assignments] == [("dev-1", 2)] and plan.new_hosts == []
    assert plan.projected_usd == 0 and plan.solver == "exact"
    # the same solve places prewarms: nothing bought either (a container runs as a VM here:
    # its kind says only where it may go)
    pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=256, kind="container"))
    assert pw.new_hosts == [] and [h.name for h in client.pool.cloud_hosts()] == ["dev-1"]
    assert (pw.kind, pw.placements[0].host) == ("container", "dev-1")
    assert client.pool.remove_prewarm(pw.id)


def test_a_prewarm_of_an_image_no_host_or_cloud_has_is_refused_and_nothing_bought(pool):
    client, _ = pool
    with pytest.raises(fuse.ApiError) as e:
        client.pool.prewarm("nosuchimage", {"count": 1})  # (options as a dict: the controller checks them)
    assert (e.value.status, e.value.code) == (400, "invalid_argument") and "nosuchimage" in e.value.message
    assert "linux" in e.value.message  # what there is: the fake machines' bundle
    assert client.pool.cloud_hosts() == [] and client.pool.prewarms() == []
    # an id of "" names no prewarm (it was a redirect to the list, read as success)
    assert client.pool.remove_prewarm("") is False
    with pytest.raises(fuse.ApiError) as e:
        client.vms.get("")
    assert e.value.status == 404
    # one name alone is a list of one, not its letters
    assert client.pool.cloud_remove_host("dev-9").failed == ["dev-9: not a host this pool added"]


def test_a_plan_buys_no_machine_for_an_image_no_linked_cloud_gives_its_machines(pool):
    # the fake machines get the 'linux' bundle only: one bought for 'other' refused its VMs
    client, _ = pool
    plan = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=2, image="other", kind="container", apply=True))
    assert plan.new_hosts == [] and plan.added == [] and plan.assignments == []
    assert plan.unplaced[0].count == 2 and "image 'other'" in plan.unplaced[0].reason
    assert client.pool.cloud_hosts() == []
    plan = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=2, image="linux", kind="container"))
    assert plan.new_hosts and plan.unplaced == []  # the image its machines get: bought as before


def test_the_budget_refuses_machines_past_its_caps_and_buys_none_of_them(pool):
    client, _ = pool
    client.pool.cloud_budget(fuse.ElasticBudgetUpdate(max_new_hosts=1))
    with pytest.raises(fuse.ApiError) as e:
        client.pool.cloud_add_host("dev", "local.small", count=2)
    assert e.value.status == 409 and e.value.code == "budget_exceeded" and "max_new_hosts" in e.value.message
    assert client.pool.cloud_hosts() == []
    client.pool.cloud_budget(fuse.ElasticBudgetUpdate(max_new_hosts=0, max_usd_per_hour=1.0))
    with pytest.raises(fuse.ApiError) as e:
        client.pool.cloud_add_host("dev", "local.big")
    assert e.value.code == "budget_exceeded" and "max_usd_per_hour" in e.value.message
    with pytest.raises(fuse.ApiError) as e:
        client.pool.cloud_add_host("dev", "no.such.type")
    assert e.value.status == 400 and e.value.code == "invalid_argument"
    assert client.pool.cloud_hosts() == []


def test_a_vm_on_a_cloud_lands_on_its_host_and_blocks_removal_until_it_is_gone(pool):
    client, _ = pool
    client.pool.cloud_add_host("dev", "local.small")
    joined(client, "dev-1")
    vm = create_vm(client, name="job-1", on="dev")
    assert vm["host"] == "dev-1"
    with pytest.raises(fuse.ApiError) as e:  # no host of the operator's own: on local has nowhere to go
        create_vm(client, name="job-2", on="local")
    assert e.value.code == "fleet_full"
    removed = client.pool.cloud_remove_host(["dev-1"])
    assert removed.removed == [] and "1 VM on it (job-1)" in removed.failed[0]
    client._send(fuse_call("DELETE", "/v1/vms/job-1"))
    assert client.pool.cloud_remove_host(["dev-1"]).removed == ["dev-1"]


def test_plan_apply_buys_the_cheapest_machines_and_reconcile_removes_them_when_idle(pool):
    client, _ = pool
    plan = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=3, cpus=1, memory_mb=1024, kind="microvm",
                                                         duration_secs=20, apply=True))
    assert plan.unplaced == [] and len(plan.added) == len(plan.new_hosts) >= 1
    assert {a.type_name for a in plan.added} <= {"local.small", "local.big"}
    # the whole answer in its json, what the apply did included (review 25: `added` was [] there)
    said = json.loads(plan.json)["plan"]
    assert [a["name"] for a in said["added"]] == [a.name for a in plan.added]
    assert said["explain"] == plan.explain and said["explain"][-1].startswith("apply: added ")
    # no TTL: each ends on its own when scale-in removes it, at the end of the time paid for its planned work
    # (to the second: started is a float, billing counts whole seconds)
    assert all(not a.pinned for a in plan.added)
    assert [a.expires for a in plan.added] == [pytest.approx(a.started + h.billed_secs, abs=1)
                                               for a, h in zip(plan.added, plan.new_hosts)]
    for a in plan.added:
        joined(client, a.name)
    listed = {h.name: h.expires for h in client.pool.cloud_hosts()}  # as the hosts list says it, too
    assert [listed[a.name] for a in plan.added] == [pytest.approx(a.expires, abs=1) for a in plan.added]
    # idle, but bought for work planned to run 20 s (and 5 s of boot): kept until then,
    # though that end is within the scaler's horizon (the VMs may not be created yet)
    decisions = client.pool.cloud_reconcile()
    assert {d.host: d.action for d in decisions} == {a.name: "keep" for a in plan.added}
    assert all("planned until" in d.reason for d in decisions)
    ends = max(a.started + h.billed_secs for a, h in zip(plan.added, plan.new_hosts))
    time.sleep(max(0.0, ends - time.time() + 1))
    # per-second billing: an idle machine past its planned work is at the end of its paid time
    decisions = client.pool.cloud_reconcile()
    assert sorted(d.host for d in decisions if d.action == "remove") == sorted(a.name for a in plan.added)
    assert all(d.saves_usd > 0 for d in decisions)
    assert client.pool.cloud_hosts() == []


def test_a_create_on_auto_with_autoscale_on_buys_a_machine_when_no_host_has_room(pool):
    client, _ = pool
    with pytest.raises(fuse.ApiError) as e:  # autoscale off: nothing is bought
        create_vm(client, name="job-1")
    assert e.value.code == "fleet_full" and client.pool.cloud_hosts() == []
    client.pool.cloud_budget(fuse.ElasticBudgetUpdate(autoscale=True))
    started = time.monotonic()
    vm = create_vm(client, name="job-1")
    (h,) = client.pool.cloud_hosts()
    assert vm["host"] == h.name and h.state == "joined" and not h.pinned
    assert time.monotonic() - started < 60
    # a cap in the way: refused, saying which cap, and nothing more bought
    client.pool.cloud_budget(fuse.ElasticBudgetUpdate(max_new_hosts=1))
    with pytest.raises(fuse.ApiError) as e:
        create_vm(client, name="big", shape={"vcpus": 1, "mem_mib": 4096})
    assert e.value.code == "fleet_full" and "max_new_hosts" in e.value.message, e.value.message
    assert "max_new_hosts" in e.value.details["hosts"]["elastic pool"]
    assert [x.name for x in client.pool.cloud_hosts()] == [h.name]
    client._send(fuse_call("DELETE", "/v1/vms/job-1"))


def test_a_create_on_a_cloud_uncordons_its_host_with_room_before_buying_another(pool, tmp_path):
    # scale-in cordoned dev-1 (an own host had room for its VM); a create pinned to that cloud
    # bought dev-2 beside it, a second paid machine, while dev-1 had the room
    from support import start_agent

    client, _ = pool
    own = start_agent(tmp_path, backend="fake", name="own")
    try:
        client.hosts.register(fuse.RegisterHostRequest(id="own", url=own.url, token=own.token, backend="qemu",
                                                       capacity=fuse.HostCapacity(vm_count=8, ram_mb=4096, cpus=4)))
        client.pool.cloud_budget(fuse.ElasticBudgetUpdate(autoscale=True))
        bought_at = time.time()
        assert create_vm(client, name="a", on="dev")["host"] == "dev-1"
        (h,) = client.pool.cloud_hosts()
        planned = {d.host: d for d in client.pool.cloud_reconcile()}
        assert planned["dev-1"].action == "cordon", planned  # the own host has room for a
        assert client.hosts.get("dev-1").state == "cordoned"
        assert create_vm(client, name="b", on="dev")["host"] == "dev-1"  # reopened, nothing bought
        assert [x.name for x in client.pool.cloud_hosts()] == ["dev-1"]
        assert client.hosts.get("dev-1").state == "active"
        for n in ("a", "b"):
            client._send(fuse_call("DELETE", f"/v1/vms/{n}"))
        # bought for one VM, placed at once: kept for it only through its join, not a default hour
        (d,) = [d for d in client.pool.cloud_reconcile() if d.host == "dev-1"]
        assert d.action == "remove" or d.until < bought_at + 600, d
    finally:
        own.stop()


def test_an_aws_cloud_buys_real_ec2_calls_and_terminates_what_it_bought(tmp_path, loopback_subnet):
    """The aws kind through the controller against a moto server on loopback: the machine is
    bought (an instance of the type, tagged), waits to join (moto runs no agent), and removing it
    terminates the instance. The secret never comes back."""
    import boto3
    from moto.server import ThreadedMotoServer

    from support import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    ctl = start_controller(tmp_path)
    client = fuse.Client(ctl.url)
    try:
        url = f"http://127.0.0.1:{port}"
        ec2 = boto3.client("ec2", region_name="us-west-2", endpoint_url=url, aws_access_key_id="k",
                           aws_secret_access_key="s3cr3t-value")
        ami = ec2.describe_images()["Images"][0]["ImageId"]
        cloud = client.pool.link_cloud("aws", "aws", {"image_id": ami, "endpoint_url": url, "access_key_id": "k",
                                                      "secret_access_key": "s3cr3t-value",
                                                      "subnet_id": loopback_subnet(ec2)})
        assert "s3cr3t-value" not in str(cloud) and "m7i.large" in cloud["types"]
        (h,) = client.pool.cloud_add_host("aws", "m7i.large", ttl_hours=1)
        assert h.name == "aws-1" and h.state == "booting" and h.id.startswith("i-")
        (inst,) = [i for r in ec2.describe_instances(InstanceIds=[h.id])["Reservations"] for i in r["Instances"]]
        assert inst["InstanceType"] == "m7i.large"
        assert {"Key": "Name", "Value": "aws-1"} in inst["Tags"]
        # what the controller (a process: no in-process guard) probes is on loopback, not moto's made-up IPs
        assert "PublicIpAddress" not in inst and inst["PrivateIpAddress"].startswith("127.0.1."), inst
        plan = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=1, kind="container"))
        assert all(n.provider == "aws" for n in plan.new_hosts)  # only the linked cloud's offers now
        with pytest.raises(fuse.ApiError) as e:  # the images its machines get are known (was a 500)
            client.pool.prewarm("nosuchimage", {"count": 1})
        assert e.value.status == 400 and "linux" in e.value.message
        assert client.pool.cloud_remove_host(["aws-1"]).removed == ["aws-1"]
        state = ec2.describe_instances(InstanceIds=[h.id])["Reservations"][0]["Instances"][0]["State"]["Name"]
        assert state in ("shutting-down", "terminated")
        assert [g.state for g in client.pool.cloud_hosts(include_gone=True)] == ["gone"]
    finally:
        client.close()
        ctl.stop()
        server.stop()


def test_concurrent_creates_that_scale_out_share_the_machine_one_of_them_bought(pool):
    from concurrent.futures import ThreadPoolExecutor

    client, ctl = pool
    # one machine type of 4 vCPUs (plans count vCPUs as a machine's size): room for all three
    client.pool.link_cloud("dev", "local", {"backend": "fake", "types": TYPES[1:]})
    client.pool.cloud_budget(fuse.ElasticBudgetUpdate(autoscale=True))

    def create(i):
        with fuse.Client(ctl.url) as c:  # a client per thread: each its own connection
            return create_vm(c, name=f"job-{i}", on="dev")

    # two: a local machine's agent reports this 2-core box's CPUs as its free vCPUs
    with ThreadPoolExecutor(2) as ex:
        vms = list(ex.map(create, range(2)))
    hosts = client.pool.cloud_hosts()
    assert len(hosts) == 1 and {v["host"] for v in vms} == {hosts[0].name}
    for i in range(2):
        client._send(fuse_call("DELETE", f"/v1/vms/job-{i}"))


@pytest.mark.postgres
def test_two_controllers_on_postgresql_share_the_clouds_hosts_and_budget(tmp_path, postgres):
    url = postgres.create_db("fuse_pool_shared")
    a = start_controller(tmp_path, db=url, name="ctl-a")
    b = start_controller(tmp_path, db=url, name="ctl-b")
    try:
        with fuse.Client(a.url) as ca, fuse.Client(b.url) as cb:
            ca.pool.link_cloud("dev", "local", {"backend": "fake", "types": TYPES})
            assert [c["name"] for c in cb.pool.clouds()] == ["dev"]
            cb.pool.cloud_budget(fuse.ElasticBudgetUpdate(max_new_hosts=2))
            assert ca.pool.cloud_budget().max_new_hosts == 2
            (h,) = cb.pool.cloud_add_host("dev", "local.small")
            joined(ca, h.name)  # bought through one replica, followed by both
            time.sleep(3)  # both replicas' loops look at it a few times: neither calls it gone
            assert [x.state for x in ca.pool.cloud_hosts()] == ["joined"]
            with pytest.raises(fuse.ApiError) as e:
                ca.pool.cloud_add_host("dev", "local.small", count=2)
            assert e.value.code == "budget_exceeded"
            assert ca.pool.cloud_remove_host([h.name]).removed == [h.name]
            assert cb.pool.cloud_hosts() == []
    finally:
        a.stop()
        b.stop()
        reap(tmp_path)


def own_host(client, tmp_path):
    """An own host (fake agent, 4 GiB, 8 VMs) registered as ``own``: stop it when done."""
    from support import start_agent

    own = start_agent(tmp_path, backend="fake", name="own")
    client.hosts.register(fuse.RegisterHostRequest(id="own", url=own.url, token=own.token, backend="qemu",
                                                   capacity=fuse.HostCapacity(vm_count=8, ram_mb=4096, cpus=4)))
    return own


def test_a_host_the_scaler_cordoned_is_room_for_plans_prewarms_and_creates_before_a_new_machine(pool, tmp_path):
    # a plan bought local.big beside two hosts scale-in had cordoned with GiBs free: only a
    # create (with autoscale on) looked at them first; a prewarm and a plan did not
    client, _ = pool
    own = own_host(client, tmp_path)
    try:
        plan = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=1, cpus=1, memory_mb=256, provider="dev",
                                                              hosts=1, duration_secs=1, apply=True))
        (h,) = plan.added
        joined(client, h.name)
        create_vm(client, name="a", host=h.name)
        assert {d.host: d.action for d in client.pool.cloud_reconcile()} == {h.name: "cordon"}  # own has room

        p = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=1, cpus=1, memory_mb=256, provider="dev"))
        assert [(a.host, a.count) for a in p.assignments] == [(h.name, 1)] and p.new_hosts == [], p.explain
        assert "the scaler had cordoned it" in p.explain[0], p.explain

        pw = client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=256, kind="container",
                                                              on="dev"))
        assert pw.new_hosts == [] and [x.host for x in pw.placements] == [h.name]
        wait_until(lambda: client.pool.prewarms()[0].ready == 1, timeout=30, what="the standby VM ready")
        assert client.hosts.get(h.name).state == "active"  # its standby VM uncordoned it
        assert [x.state for x in client.pool.cloud_hosts()] == ["joined"]
        assert client.pool.remove_prewarm(pw.id)

        assert {d.host: d.action for d in client.pool.cloud_reconcile()} == {h.name: "cordon"}
        client.pool.cloud_budget(fuse.ElasticBudgetUpdate(autoscale=False))
        assert create_vm(client, name="b", on="dev")["host"] == h.name  # autoscale off: reopened all the same
        assert [x.name for x in client.pool.cloud_hosts()] == [h.name]

        client.hosts.cordon(h.name)  # an operator's cordon is no room for a plan
        p = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=1, cpus=1, memory_mb=256, provider="dev"))
        assert p.new_hosts and all(a.host != h.name for a in p.assignments), p.explain
        with pytest.raises(fuse.ApiError) as e:  # nor may a create take it
            create_vm(client, name="c", host=h.name)
        assert e.value.code == "fleet_full" and "cordoned" in e.value.details["hosts"][h.name]
        with pytest.raises(fuse.ApiError) as e:  # an elastic host is none of the operator's own
            create_vm(client, name="c", on="local", host=h.name)
        assert (e.value.status, e.value.code) == (400, "invalid_argument") and "disagree" in e.value.message
    finally:
        own.stop()


def test_a_create_on_a_cloud_without_hosts_says_why_and_a_host_outside_it_is_refused(pool, tmp_path):
    client, _ = pool
    own = own_host(client, tmp_path)
    try:
        with pytest.raises(fuse.ApiError) as e:
            create_vm(client, name="a", on="dev")
        assert (e.value.status, e.value.code) == (409, "fleet_full")
        hosts = e.value.details["hosts"]  # it was {}: nothing an operator could act on
        assert hosts["own"] == "not a host of cloud dev", hosts
        assert "autoscale is off" in hosts["elastic pool"], hosts
        assert "cloud dev has no hosts" in e.value.message and "autoscale is off" in e.value.message
        with pytest.raises(fuse.ApiError) as e:  # as on host:own with host other: 400, not fleet_full
            create_vm(client, name="a", on="dev", host="own")
        assert (e.value.status, e.value.code) == (400, "invalid_argument")
        assert e.value.message == "host own and on dev disagree: own is not a host of cloud dev"
        assert client.pool.cloud_hosts() == []
    finally:
        own.stop()


def test_a_budget_cap_used_up_says_the_cap_as_set_and_what_runs(pool):
    # max_new_hosts=2 with 2 running read "no room within the caps: max_new_hosts=0" (0: no cap)
    client, _ = pool
    for h in client.pool.cloud_add_host("dev", "local.small", count=2):
        joined(client, h.name)
    client.pool.cloud_budget(fuse.ElasticBudgetUpdate(max_new_hosts=2))
    p = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=1, cpus=1, memory_mb=2048, kind="container"))
    (u,) = p.unplaced
    assert "max_new_hosts reached" in u.reason and "max_new_hosts=0" not in u.reason, u.reason
    with pytest.raises(fuse.ApiError) as e:
        client.pool.prewarm("linux", fuse.PrewarmOptions(count=1, cpus=1, memory_mb=2048, kind="container"))
    assert e.value.code == "budget_exceeded" and "max_new_hosts=0" not in e.value.message, e.value.message
    assert "max_new_hosts reached" in e.value.message and "max_new_hosts=2; 2 elastic hosts running" in e.value.message
    assert len(client.pool.cloud_hosts()) == 2


def test_a_create_on_auto_takes_an_own_host_before_a_cloud_host_as_the_plan_does(pool, tmp_path):
    # seed 001: "on auto ... places by one solve over your devices, your hosts and new cloud
    # machines": your devices first. Best fit alone alternated between an own host and an
    # empty cloud host, while the plan put the VM on the own one
    client, _ = pool
    own = own_host(client, tmp_path)
    try:
        client.pool.cloud_add_host("dev", "local.big", ttl_hours=1)
        joined(client, "dev-1")
        plan = client.pool.cloud_plan(fuse.ElasticPlanRequest(count=1, cpus=1, memory_mb=256, kind="container"))
        assert [a.host for a in plan.assignments] == ["own"], plan.explain
        hosts = [create_vm(client, name=f"o{i}")["host"] for i in range(8)]
        assert hosts == ["own"] * 8  # its vm_count policy is 8
        assert create_vm(client, name="o8")["host"] == "dev-1"  # own is full: the cloud host next
        # a pin or best fit on one cloud is as asked
        assert create_vm(client, name="p1", on="dev")["host"] == "dev-1"
    finally:
        own.stop()
