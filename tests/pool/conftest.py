"""Fixtures the pool tests share."""

from __future__ import annotations

import ipaddress
import socket

import pytest

import fuse
from support import free_port, reap, start_controller

# The modules whose tests run against moto: their clouds' machines get made-up addresses,
# which a controller following them probes. Each runs under ``loopback_only``.
MOTO_MODULES = {"test_providers_aws", "test_review16_aws", "test_review18_elastic", "test_review4_caps",
                "test_review4_booting", "test_elastic_e2e", "test_review32_model", "test_review32_prewarm"}


@pytest.fixture(scope="module")
def moto_url():
    """A moto EC2 server on loopback for the module's tests (the aws provider's endpoint_url)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=(port := free_port()), verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def _loopback_subnet(ec2) -> str:
    """A subnet in 127.0.0.0/8 that gives no public IP, in the moto EC2 of ``ec2`` (a boto3 client).

    Network tests talk only to loopback: an instance moto starts in its default subnet has a
    made-up public IP (and a 172.31.x.x private one) that a controller following the machine
    would probe. One started in this subnet has only a 127.0.1.x address, on loopback, where
    no agent answers."""
    vpc = ec2.create_vpc(CidrBlock="127.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="127.0.1.0/24")["Subnet"]["SubnetId"]
    ec2.modify_subnet_attribute(SubnetId=subnet, MapPublicIpOnLaunch={"Value": False})
    return subnet


@pytest.fixture
def loopback_subnet():
    """``_loopback_subnet``, for a test that starts a moto server of its own."""
    return _loopback_subnet


@pytest.fixture(scope="module")
def moto_subnet(moto_url) -> str:
    """The ``subnet_id`` every aws cloud on ``moto_url`` is linked with: its machines' addresses
    are on loopback (``loopback_subnet``)."""
    import boto3

    return _loopback_subnet(boto3.client("ec2", region_name="us-west-2", endpoint_url=moto_url,
                                         aws_access_key_id="testing", aws_secret_access_key="testing"))


@pytest.fixture
def link_aws(moto_url, moto_subnet):
    """``link_aws(client)``: link ``moto_url``'s EC2 to the controller as cloud ``aws1`` (an
    x86_64 EBS image, the loopback subnet: its machines never join)."""
    import boto3

    ec2 = boto3.client("ec2", region_name="us-west-2", endpoint_url=moto_url, aws_access_key_id="testing",
                       aws_secret_access_key="testing")
    ami = next(i["ImageId"] for i in ec2.describe_images()["Images"]
               if i["Architecture"] == "x86_64" and i.get("RootDeviceType") == "ebs")

    def link(client) -> None:
        client.pool.link_cloud("aws1", "aws", {"image_id": ami, "endpoint_url": moto_url, "access_key_id": "testing",
                                               "secret_access_key": "testing", "subnet_id": moto_subnet})
    return link


def _loopback(family: int, address) -> bool:
    if family == getattr(socket, "AF_UNIX", None):
        return True
    host = address[0] if isinstance(address, tuple) else address
    try:
        ip = ipaddress.ip_address(str(host).split("%")[0])
    except ValueError:  # a name: connect() resolves it itself (nothing here does)
        return False
    return (ip.ipv4_mapped or ip).is_loopback if ip.version == 6 else ip.is_loopback


@pytest.fixture(autouse=True)
def loopback_only(request):
    """In the moto modules, a connect from this process to anything but loopback (127.0.0.0/8,
    ::1) or a unix socket is refused and fails the test, whichever thread made it (a probe the
    controller swallows as "no agent answered" too). A controller started as a process is not
    covered: its machines' addresses come from ``loopback_subnet`` all the same."""
    if request.module.__name__ not in MOTO_MODULES:
        yield
        return
    refused: list[str] = []
    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex

    def check(sock, address) -> bool:
        if _loopback(sock.family, address):
            return True
        refused.append(repr(address))
        return False

    def guarded_connect(self, address):
        if not check(self, address):
            raise OSError(101, f"a test connected to {address!r}, not loopback")
        return connect(self, address)

    def guarded_connect_ex(self, address):
        return connect_ex(self, address) if check(self, address) else 101

    socket.socket.connect, socket.socket.connect_ex = guarded_connect, guarded_connect_ex
    try:
        yield
    finally:
        socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
    assert not refused, f"connections that would have left loopback: {refused}"


@pytest.fixture
def pool_client(tmp_path):
    """A client of a controller started for the test; after it, the pool's machines removed and the
    controller stopped (and a machine a failed test left behind: its agent runs from under tmp_path)."""
    p = start_controller(tmp_path)
    client = fuse.Client(p.url)
    yield client
    client.pool.cloud_remove_host([h.name for h in client.pool.cloud_hosts()])
    client.close()
    p.stop()
    reap(tmp_path)
