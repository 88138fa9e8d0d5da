"""The aws cloud as a black-box review against moto found it (review 16): an AMI has one
architecture and the link asks EC2 which (and whether the link works at all); a machine
whose cloud cannot be asked still times out; a machine late to join is not "joining in
1 s"; the root volume is the one the prices include; a stopped machine is terminated;
the ``creating`` event keeps the machine type; the link's help lists every option.

Against the real controller app (not started: nothing joins, the pool's passes are run
by hand) and the provider itself, on the moto EC2 server of ``test_providers_aws``."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from sqlalchemy import update
from test_providers_aws import SECRET, TOKEN, _tags, ami, ec2, provider  # noqa: F401 (fixtures)
from test_review4_caps import app  # noqa: F401 (the fixture: a controller app, its machines removed after)
from typer.testing import CliRunner

from fuse.controller.pool.elastic_host import JOIN_GRACE_SECS
from fuse.controller.pool.providers import KINDS, link
from fuse.controller.store import elastic_hosts as hosts_t
from fuse.errors import InvalidArgument
from support import free_port


@pytest.fixture(scope="module")
def arm_ami(ec2) -> str:  # noqa: F811
    return next(i["ImageId"] for i in ec2.describe_images()["Images"]
                if i["Architecture"] == "arm64" and i.get("RootDeviceType") == "ebs")


@pytest.fixture(scope="module")
def x86_ami(ec2, ami) -> str:  # noqa: F811
    assert ec2.describe_images(ImageIds=[ami])["Images"][0]["Architecture"] == "x86_64"
    return ami



def options(url: str, image_id, subnet_id: str | None = None, **more) -> dict:
    """The link options of a cloud on ``url``; ``subnet_id`` (``moto_subnet``) keeps its machines'
    addresses on loopback."""
    return {"image_id": image_id, "endpoint_url": url, "access_key_id": "testing", "secret_access_key": SECRET,
            **({"subnet_id": subnet_id} if subnet_id else {}), **more}


def put(client, name: str, opts: dict):
    return client.put(f"/v1/pool/clouds/{name}", json={"kind": "aws", "options": opts})


def arch_of(ctl, cloud: str) -> set[str]:
    return {o.arch for o in ctl.pool.provider(cloud).offers()}


def age(ctl, name: str, secs: float) -> None:
    """Make ``name`` bought ``secs`` ago."""
    with ctl.store.tx() as c:
        c.execute(update(hosts_t).where(hosts_t.c.name == name).values(started=time.time() - secs))


# ---- 1. one AMI, one architecture; the link asks EC2 ---------------------------------------

def test_a_single_x86_ami_offers_only_amd64_types_and_c6g_metal_is_refused(app, moto_url, moto_subnet, x86_ami):
    client, ctl = app
    r = put(client, "archtest", options(moto_url, x86_ami, moto_subnet))
    assert r.status_code == 200, r.text
    assert arch_of(ctl, "archtest") == {"amd64"} and "c6g.metal" not in r.json()["types"]
    assert r.json()["options"]["image_id"] == {"amd64": x86_ami}  # stored resolved: a re-link asks nothing
    ctl.pool._providers.clear()
    assert arch_of(ctl, "archtest") == {"amd64"}
    r = client.post("/v1/pool/hosts", json={"provider": "archtest", "instance_type": "c6g.metal"})
    assert r.status_code == 400 and "c6g.metal" in r.json()["error"]["message"], r.text
    # microVM work needs KVM, which only c6g.metal (arm64) has here: nothing this AMI boots takes it
    r = client.post("/v1/pool/plan", json={"count": 1, "cpus": 2, "memory_mb": 2048, "provider": "archtest"})
    assert r.status_code == 200 and r.json()["new_hosts"] == [] and r.json()["unplaced"], r.text


def test_a_single_arm_ami_offers_only_arm64_types(app, moto_url, moto_subnet, arm_ami):
    client, ctl = app
    r = put(client, "armtest", options(moto_url, arm_ami, moto_subnet))
    assert r.status_code == 200, r.text
    assert arch_of(ctl, "armtest") == {"arm64"} and "c6g.metal" in r.json()["types"]


def test_the_per_arch_mapping_still_works_and_each_ami_must_be_of_its_arch(app, moto_url, moto_subnet, x86_ami,
                                                                           arm_ami):
    client, ctl = app
    r = put(client, "both", options(moto_url, {"amd64": x86_ami, "arm64": arm_ami}, moto_subnet))
    assert r.status_code == 200, r.text
    assert arch_of(ctl, "both") == {"amd64", "arm64"}
    r = put(client, "swapped", options(moto_url, {"arm64": x86_ami}, moto_subnet))
    assert r.status_code == 400 and "image_id.arm64" in r.json()["error"]["message"], r.text


def test_an_ami_ec2_does_not_have_is_400_naming_image_id_and_region_and_nothing_is_stored(app, moto_url,
                                                                                          moto_subnet):
    client, _ = app
    r = put(client, "noami", options(moto_url, "ami-12345678", moto_subnet))
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument", r.text
    message = r.json()["error"]["message"]
    assert "image_id" in message and "ami-12345678" in message and "us-west-2" in message
    assert client.get("/v1/pool/clouds").json()["clouds"] == []


def test_an_endpoint_that_does_not_answer_refuses_the_link_with_the_clouds_reason(app, x86_ami):
    client, _ = app
    r = put(client, "down", options(f"http://127.0.0.1:{free_port()}", x86_ami))
    assert r.status_code == 502 and r.json()["error"]["code"] == "cloud_error", r.text
    assert "EndpointConnectionError" in r.json()["error"]["message"] and SECRET not in r.text
    assert client.get("/v1/pool/clouds").json()["clouds"] == []


def test_wrong_credentials_refuse_the_link_with_the_clouds_reason(app, moto_url, moto_subnet, x86_ami,
                                                                  monkeypatch):
    import moto.settings
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # (the server is in-process)
    client, _ = app
    r = put(client, "badkey", options(moto_url, x86_ami, moto_subnet))
    assert r.status_code == 502 and r.json()["error"]["code"] == "cloud_error", r.text
    assert "AuthFailure" in r.json()["error"]["message"] and SECRET not in r.text
    assert client.get("/v1/pool/clouds").json()["clouds"] == []


def test_missing_credentials_refuse_the_link_with_the_clouds_reason(app, moto_url, moto_subnet, x86_ami, monkeypatch,
                                                                    tmp_path):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    client, _ = app
    r = put(client, "nokey", {"image_id": x86_ami, "endpoint_url": moto_url, "subnet_id": moto_subnet})
    assert r.status_code == 502 and r.json()["error"]["code"] == "cloud_error", r.text
    assert "NoCredentialsError" in r.json()["error"]["message"]
    assert client.get("/v1/pool/clouds").json()["clouds"] == []


def test_an_empty_types_list_is_said_to_be_empty(tmp_path):
    with pytest.raises(InvalidArgument) as err:
        link("aws", "a", {"image_id": "ami-1", "types": []}, tmp_path)
    assert "types" in err.value.message and "empty" in err.value.message
    assert "architecture" not in err.value.message


# ---- 2. a cloud that cannot be asked; a machine late to join -------------------------------

def test_a_booting_machine_whose_cloud_is_down_goes_offline_past_boot_and_grace(app, moto_subnet, x86_ami):
    from moto.server import ThreadedMotoServer

    client, ctl = app
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=(port := free_port()), verbose=False)
    server.start()
    try:
        # (moto_subnet is this server's too: moto's state is the process's, whichever server serves it)
        assert put(client, "flaky", options(f"http://127.0.0.1:{port}", x86_ami, moto_subnet)).status_code == 200
        r = client.post("/v1/pool/hosts", json={"provider": "flaky", "instance_type": "t3.medium"})
        assert r.status_code == 201, r.text
        (h,) = r.json()["hosts"]
    finally:
        server.stop()  # the cloud's API goes down with the machine booting
    age(ctl, h["name"], ctl.pool.row(h["name"])["boot_secs"] + JOIN_GRACE_SECS + 10)
    asyncio.run(ctl.pool.tick())
    row = ctl.pool.row(h["name"])
    assert row["state"] == "offline", row["record"]
    assert "cannot be asked" in row["record"]["reason"]
    assert not any(s.get("joins_in_secs") for s in ctl.pool_snapshot())  # no longer room for plans


def test_a_running_machine_whose_agent_never_answers_goes_offline_past_boot_and_grace(app, moto_url, moto_subnet,
                                                                                      x86_ami):
    """(review 22: moto's instance runs at once with an address no agent answers on; it stayed
    ``booting`` for good, offered to plans and counted as ready in 1 s)"""
    client, ctl = app
    assert put(client, "aws", options(moto_url, x86_ami, moto_subnet)).status_code == 200
    (h,) = client.post("/v1/pool/hosts", json={"provider": "aws", "instance_type": "t3.medium"}).json()["hosts"]
    asyncio.run(ctl.pool.tick())
    assert ctl.pool.row(h["name"])["state"] == "booting"  # (within its time: it may yet answer)
    age(ctl, h["name"], ctl.pool.row(h["name"])["boot_secs"] + JOIN_GRACE_SECS + 10)
    asyncio.run(ctl.pool.tick())
    row = ctl.pool.row(h["name"])
    assert row["state"] == "offline", row
    assert row["record"]["reason"].startswith(f"no agent answered within {row['boot_secs'] + JOIN_GRACE_SECS} s")
    assert not any(s.get("joins_in_secs") for s in ctl.pool_snapshot())  # no longer room for plans


def test_a_machine_past_its_boot_time_is_said_to_be_late_not_joining_in_1_s(app, moto_url, moto_subnet, x86_ami):
    client, ctl = app
    assert put(client, "aws", options(moto_url, x86_ami, moto_subnet)).status_code == 200
    (h,) = client.post("/v1/pool/hosts", json={"provider": "aws", "instance_type": "t3.medium"}).json()["hosts"]
    age(ctl, h["name"], ctl.pool.row(h["name"])["boot_secs"] + 60)
    r = client.post("/v1/pool/plan", json={"count": 1, "kind": "container", "cpus": 1, "memory_mb": 512})
    assert r.status_code == 200, r.text
    p = r.json()
    assert p["new_hosts"] == [] and not any("joins in about 1 s" in line for line in p["explain"]), p["explain"]
    assert any(f"on {h['name']}" in line and "s late" in line for line in p["explain"]), p["explain"]
    body = json.loads(p["json"])
    assert body["late"] == {h["name"]: pytest.approx(60, abs=5)}
    # its figure is the latest it may still join: the rest of its grace
    assert JOIN_GRACE_SECS - 70 <= p["ready_in_secs"] == body["joining"][h["name"]] <= JOIN_GRACE_SECS - 55


# ---- 3. the root volume the prices include -----------------------------------------------

async def test_the_root_volume_is_the_offers_gp3_disk_tagged_like_the_instance(provider, ec2, ami):  # noqa: F811
    m = await provider.create(host_name="disk-1", type_name="t3.medium", region="us-west-2", agent_token=TOKEN)
    root = ec2.describe_images(ImageIds=[ami])["Images"][0]["RootDeviceName"]
    (vol,) = ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id", "Values": [m.id]}])["Volumes"]
    assert (vol["Size"], vol["VolumeType"], vol["Attachments"][0]["Device"]) == (
        provider.offer("t3.medium", None).disk_gb, "gp3", root) == (60, "gp3", root)
    assert _tags(vol) == {"Name": "disk-1", "fuse-pool": "aws-west"}
    inst = ec2.describe_instances(InstanceIds=[m.id])["Reservations"][0]["Instances"][0]
    assert [b["Ebs"]["DeleteOnTermination"] for b in inst["BlockDeviceMappings"]] == [True]
    await provider.terminate(m.id)


# ---- 4. a stopped machine is terminated ---------------------------------------------------

async def test_a_guest_shutdown_terminates_the_machine(provider, ec2):  # noqa: F811
    m = await provider.create(host_name="shut-1", type_name="t3.medium", region="us-west-2", agent_token=TOKEN)
    got = ec2.describe_instance_attribute(InstanceId=m.id, Attribute="instanceInitiatedShutdownBehavior")
    assert got["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    await provider.terminate(m.id)


def test_a_machine_stopped_outside_the_pool_is_terminated_and_goes_gone(app, moto_url, moto_subnet, x86_ami,
                                                                        ec2):  # noqa: F811
    client, ctl = app
    assert put(client, "aws", options(moto_url, x86_ami, moto_subnet)).status_code == 200
    (h,) = client.post("/v1/pool/hosts", json={"provider": "aws", "instance_type": "t3.medium"}).json()["hosts"]
    ec2.stop_instances(InstanceIds=[h["id"]])
    asyncio.run(ctl.pool.tick())
    row = ctl.pool.row(h["name"])
    assert row["state"] == "gone" and "stopped" in row["record"]["reason"], row["record"]
    assert row["record"]["ended_by_cloud"] is True
    inst = ec2.describe_instances(InstanceIds=[h["id"]])["Reservations"][0]["Instances"][0]
    assert inst["State"]["Name"] == "terminated"
    assert client.get("/v1/pool/budget").json()["running_usd_per_hour"] == 0


# ---- 5. the creating event keeps the machine type -----------------------------------------

def test_the_creating_event_records_the_machine_type_as_type_name(app, moto_url, moto_subnet, x86_ami):
    client, _ = app
    assert put(client, "aws", options(moto_url, x86_ami, moto_subnet)).status_code == 200
    (h,) = client.post("/v1/pool/hosts", json={"provider": "aws", "instance_type": "t3.medium"}).json()["hosts"]
    events = client.get("/v1/events", params={"limit": 500}).json()["events"]
    (created,) = [e for e in events if e["type"] == "elastic_host" and e.get("to") == "creating"]
    assert (created["host"], created["type_name"]) == (h["name"], "t3.medium")


# ---- 6. the link's help and messages ------------------------------------------------------

def test_the_link_help_lists_every_option_of_every_kind():
    from fuse.cli.main import app as cli
    from fuse.controller.pool.providers import options_help
    r = CliRunner().invoke(cli, ["pool", "cloud", "link", "--help"], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.replace("│", " ").split())
    assert options_help() in text
    listed = dict(part.split(": ", 1) for part in options_help().rstrip(".").split(". "))
    for kind, cls in KINDS.items():
        assert set(listed[kind].replace(" (required)", "").split(", ")) == cls.OPTIONS
    aws = listed["aws"].split(", ")
    assert aws[0] == "image_id (required)" and {"quotas", "limits", "session_token", "package"} <= set(aws)


def test_messages_say_an_aws_cloud(tmp_path):
    with pytest.raises(InvalidArgument) as err:
        link("aws", "a", {"image_id": "ami-1", "colour": "blue"}, tmp_path)
    assert "an aws cloud" in err.value.message and "a aws" not in err.value.message
    with pytest.raises(InvalidArgument) as err:
        link("aws", "a", {"image_id": "ami-1", "agent_port": 0}, tmp_path)
    assert "of an aws cloud" in err.value.message
