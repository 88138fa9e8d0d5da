"""The AWS provider against a real moto server on loopback: options checked
before anything is bought, the EC2 calls it makes (type, tags, user data),
describe and terminate, and every cloud failure a CloudError with no secret."""

from __future__ import annotations

import asyncio
import base64

import boto3
import pytest

from fuse.controller.pool.catalogue import default_catalogue
from fuse.controller.pool.providers import AwsProvider, CloudError, link, public_options
from fuse.errors import InvalidArgument
from support import free_port

SECRET = "sEcReT-do-not-show-0123456789"
TOKEN = "agent-token-Zq9"



@pytest.fixture(scope="module")
def ec2(moto_url):
    return boto3.client("ec2", region_name="us-west-2", endpoint_url=moto_url,
                        aws_access_key_id="testing", aws_secret_access_key=SECRET)


@pytest.fixture(scope="module")
def ami(ec2) -> str:
    return ec2.describe_images()["Images"][0]["ImageId"]


@pytest.fixture
async def provider(moto_url, moto_subnet, ami, tmp_path):
    p = link("aws", "aws-west", {"image_id": ami, "endpoint_url": moto_url, "access_key_id": "testing",
                                 "secret_access_key": SECRET, "agent_port": 8123, "subnet_id": moto_subnet},
             tmp_path)
    yield p
    await p.close()


def _tags(instance: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


@pytest.mark.parametrize("options, field", [
    ({}, "image_id"),
    ({"image_id": "ami-1", "colour": "blue"}, "colour"),
    ({"image_id": "ami-1", "region": "eu-central-1"}, "region"),
    ({"image_id": "ami-1", "agent_port": 0}, "agent_port"),
    ({"image_id": "ami-1", "agent_port": "8090"}, "agent_port"),
    ({"image_id": "ami-1", "types": ["t3.medium", "z9.huge"]}, "types"),
    ({"image_id": "ami-1", "access_key_id": "AKIA"}, "secret_access_key"),
    ({"image_id": "ami-1", "secret_access_key": SECRET}, "access_key_id"),
    ({"image_id": "ami-1", "endpoint_url": "localhost:5000"}, "endpoint_url"),
    ({"image_id": "ami-1", "security_group_ids": "sg-1"}, "security_group_ids"),
    ({"image_id": {"sparc": "ami-1"}}, "image_id"),
], ids=["a missing image_id is named", "an unknown option is named", "an unpriced region is named",
        "a port out of range is named", "a port that is not an integer is named", "an unknown type is named",
        "a key id without its secret names the secret", "a secret without its key id names the key id",
        "an endpoint that is not a URL is named", "security groups that are not a list are named",
        "an image for an unknown arch is named"])
def test_link_refuses_bad_options_naming_the_field(options, field, tmp_path):
    with pytest.raises(InvalidArgument) as err:
        link("aws", "aws-west", options, tmp_path)
    assert field in err.value.message and err.value.http_status == 400
    assert SECRET not in err.value.message


def test_an_unpriced_region_lists_the_priced_ones(tmp_path):
    with pytest.raises(InvalidArgument, match="us-west-2"):
        link("aws", "aws-west", {"image_id": "ami-1", "region": "eu-central-1"}, tmp_path)


def test_offers_are_the_catalogue_rows_of_the_region_under_the_cloud_name(tmp_path):
    p = link("aws", "aws-west", {"image_id": "ami-1"}, tmp_path)
    rows = [o for o in default_catalogue() if o.provider == "aws" and o.region == "us-west-2"]
    assert isinstance(p, AwsProvider) and (p.kind, p.backend) == ("aws", "qemu")
    assert sorted(o.type_name for o in p.offers()) == sorted(o.type_name for o in rows)
    assert {o.provider for o in p.offers()} == {"aws-west"}
    assert p.capacity("m7i.xlarge") == {"vm_count": 16, "cpus": 0, "ram_mb": 0}


def test_types_and_per_arch_images_narrow_the_offers(tmp_path):
    p = link("aws", "a", {"image_id": "ami-1", "types": ["t3.medium", "c7g.large"]}, tmp_path)
    assert sorted(o.type_name for o in p.offers()) == ["c7g.large", "t3.medium"]
    arm = link("aws", "a", {"image_id": {"arm64": "ami-arm"}}, tmp_path)
    assert arm.offers() and {o.arch for o in arm.offers()} == {"arm64"}


def test_public_options_hide_the_secret():
    opts = {"image_id": "ami-1", "access_key_id": "AKIA", "secret_access_key": SECRET, "session_token": "tok"}
    shown = public_options("aws", opts)
    assert shown == {"image_id": "ami-1", "access_key_id": "AKIA"}
    assert opts["secret_access_key"] == SECRET  # the input is left alone


async def test_create_describe_terminate_round_trip(provider, ec2):
    m = await provider.create(host_name="pool-1", type_name="m7i.large", region="us-west-2", agent_token=TOKEN)
    assert m.id.startswith("i-") and m.state == "pending" and m.address == ""

    inst = ec2.describe_instances(InstanceIds=[m.id])["Reservations"][0]["Instances"][0]
    assert inst["InstanceType"] == "m7i.large"
    assert _tags(inst) == {"Name": "pool-1", "fuse-pool": "aws-west"}
    raw = ec2.describe_instance_attribute(InstanceId=m.id, Attribute="userData")["UserData"]["Value"]
    script = base64.b64decode(raw).decode()
    assert script.startswith("#!/bin/bash") and TOKEN in script and "0.0.0.0:8123" in script
    assert "fuse host serve" in script and "fuse-fleet" in script and SECRET not in script

    seen = (await provider.describe([m.id]))[m.id]
    assert seen.state == "running"
    ip = inst.get("PublicIpAddress") or inst["PrivateIpAddress"]
    assert seen.address == f"http://{ip}:8123" and ip.startswith("127.0.1.")  # (moto_subnet: on loopback)

    await provider.terminate(m.id)
    assert (await provider.describe([m.id]))[m.id].state == "terminated"
    await provider.terminate(m.id)  # idempotent


async def test_optional_options_reach_run_instances(moto_url, moto_subnet, ami, ec2, tmp_path):
    vpc = ec2.describe_subnets(SubnetIds=[moto_subnet])["Subnets"][0]["VpcId"]
    group = ec2.create_security_group(GroupName="fuse-agents", Description="fuse agents", VpcId=vpc)["GroupId"]
    ec2.create_key_pair(KeyName="ops")
    p = link("aws", "aws-west", {"image_id": ami, "endpoint_url": moto_url, "access_key_id": "testing",
                                 "secret_access_key": SECRET, "key_name": "ops", "security_group_ids": [group],
                                 "subnet_id": moto_subnet}, tmp_path)
    m = await p.create(host_name="pool-2", type_name="t3.medium", region="", agent_token=TOKEN)
    inst = ec2.describe_instances(InstanceIds=[m.id])["Reservations"][0]["Instances"][0]
    assert inst["KeyName"] == "ops" and group in [g["GroupId"] for g in inst["SecurityGroups"]]
    assert inst["SubnetId"] == moto_subnet
    await p.terminate(m.id)
    await p.close()


async def test_concurrent_creates_give_distinct_machines(provider):
    made = await asyncio.gather(*(provider.create(host_name=f"burst-{i}", type_name="t3.medium",
                                                  region="us-west-2", agent_token=TOKEN) for i in range(4)))
    assert len({m.id for m in made}) == 4
    seen = await provider.describe([m.id for m in made])
    assert {m.state for m in seen.values()} == {"running"}
    await asyncio.gather(*(provider.terminate(m.id) for m in made))


async def test_describe_reports_ids_the_cloud_does_not_know_as_terminated(provider):
    seen = await provider.describe(["i-0123456789abcdef0", "i-unknown"])
    assert {k: v.state for k, v in seen.items()} == {"i-0123456789abcdef0": "terminated", "i-unknown": "terminated"}
    assert await provider.describe([]) == {}
    await provider.terminate("i-0123456789abcdef0")  # an unknown id is fine


@pytest.mark.parametrize("type_name, region", [("z9.huge", "us-west-2"), ("t3.medium", "eu-west-1")],
                         ids=["an unknown type", "an unknown region"])
async def test_create_refuses_what_the_cloud_does_not_offer(provider, type_name, region):
    with pytest.raises(InvalidArgument, match=type_name if type_name == "z9.huge" else region):
        await provider.create(host_name="x", type_name=type_name, region=region, agent_token=TOKEN)


async def test_a_type_the_cloud_refuses_is_a_cloud_error_without_secrets(provider, monkeypatch):
    # The server runs in this process: make it validate types, and take
    # t3.medium out of the region as if AWS had stopped offering it there.
    import moto.settings
    from moto.ec2.models.instance_types import INSTANCE_TYPE_OFFERINGS
    monkeypatch.setattr(moto.settings, "EC2_ENABLE_INSTANCE_TYPE_VALIDATION", True)
    monkeypatch.setitem(INSTANCE_TYPE_OFFERINGS["region"], "us-west-2",
                        [o for o in INSTANCE_TYPE_OFFERINGS["region"]["us-west-2"] if o["InstanceType"] != "t3.medium"])
    with pytest.raises(CloudError) as err:
        await provider.create(host_name="refused", type_name="t3.medium", region="us-west-2", agent_token=TOKEN)
    e = err.value
    assert (e.http_status, e.code) == (502, "cloud_error")
    assert "InvalidInstanceType" in e.message and "t3.medium" in e.message
    assert SECRET not in e.message and SECRET not in str(e.body()) and TOKEN not in e.message


async def test_an_endpoint_that_does_not_answer_is_a_cloud_error(ami, tmp_path):
    p = link("aws", "aws-west", {"image_id": ami, "endpoint_url": f"http://127.0.0.1:{free_port()}",
                                 "access_key_id": "testing", "secret_access_key": SECRET}, tmp_path)
    for call in (p.create(host_name="h", type_name="t3.medium", region="us-west-2", agent_token=TOKEN),
                 p.describe(["i-1"]), p.terminate("i-1")):
        with pytest.raises(CloudError) as err:
            await call
        assert (err.value.http_status, err.value.code) == (502, "cloud_error")
        assert "EndpointConnectionError" in err.value.message and SECRET not in err.value.message
    await p.close()


async def test_create_refuses_a_token_the_script_could_not_carry(provider):
    with pytest.raises(InvalidArgument, match="agent_token"):
        await provider.create(host_name="h", type_name="t3.medium", region="us-west-2", agent_token="a'b\nc")
