"""The AWS provider: EC2 instances through boto3.

A machine is one instance started from the operator's AMI with a cloud-init
script (``USER_DATA``) that installs fuse and runs the host agent under
systemd on ``agent_port``. The controller then registers that agent as a
host (the elastic-host service's job, not ours).

boto3 is blocking and slow to import: it is imported on first use and every
call runs in a thread (``asyncio.to_thread``); one client serves all threads
(boto3 clients are thread-safe, sessions are not). Every botocore failure
becomes ``CloudError`` with AWS's code and message and no credential.

An AMI has one architecture. A link (``check``) asks EC2 for the AMIs
(DescribeImages): that the endpoint and credentials work, that each AMI is
there, and its architecture, so only the types it boots are offered. A single
id is then stored as ``{its arch: id}`` and a re-link (another replica, a
restart) calls nothing. A machine gets a root volume of its type's ``disk_gb``
(gp3, what the catalogue prices), ends when its guest shuts down
(``InstanceInitiatedShutdownBehavior`` terminate), and a machine stopped
anyway is reported ``stopping``: the pool terminates it.

EC2 is eventually consistent: an instance can be unknown to DescribeInstances
for a few seconds after RunInstances returned it. An id this provider created
within ``FRESH_SECS`` is therefore reported pending, not terminated, while
the cloud does not list it yet.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import shlex
import threading
import time
from collections.abc import Mapping
from typing import Any

from fuse import __version__
from fuse.controller.pool.catalogue import default_catalogue
from fuse.controller.pool.model import Offer
from fuse.errors import InvalidArgument

from .base import CAP_OPTIONS, CloudError, Machine, OptionReader, Provider, article, check_name

DEFAULT_REGION = "us-west-2"
DEFAULT_AGENT_PORT = 8090
FRESH_SECS = 300.0
DESCRIBE_CHUNK = 200  # ids per DescribeInstances filter (its documented limit)
GONE_CODES = {"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"}
NO_AMI_CODES = {"InvalidAMIID.NotFound", "InvalidAMIID.Malformed", "InvalidAMIID.Unavailable"}
ARCHS = {"x86_64": "amd64", "arm64": "arm64"}  # EC2's Architecture -> the catalogue's arch
# EC2 state -> Machine state. A stopped instance cannot run VMs but still
# exists (and bills its disk): "stopping", which the pool terminates.
STATES = {"pending": "pending", "running": "running", "shutting-down": "stopping", "stopping": "stopping",
          "stopped": "stopping", "terminated": "terminated"}
# The token lands in a shell heredoc and a systemd EnvironmentFile: keep it to
# characters neither interprets.
TOKEN_RE = re.compile(r"^[A-Za-z0-9._~+/=-]{1,512}$")

USER_DATA = """#!/bin/bash
# fuse elastic pool: make this instance a fuse host agent.
# cloud-init runs this once, as root, at first boot.
set -euo pipefail

# The agent's token: owner-only, read by systemd, never on a command line.
install -d -m 0700 /etc/fuse-host
umask 077
cat > /etc/fuse-host/env <<'FUSE_TOKEN_EOF'
FUSE_HOST_TOKEN={token}
FUSE_TOKEN_EOF
umask 022

case "$(uname -m)" in aarch64) qemu_pkg=qemu-system-arm ;; *) qemu_pkg=qemu-system-x86 ;; esac
if command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q python3-venv "$qemu_pkg" qemu-utils busybox-static
elif command -v dnf >/dev/null; then
  dnf install -y -q python3 qemu-kvm busybox || dnf install -y -q python3
fi
python3 -m venv /opt/fuse
/opt/fuse/bin/pip install -q {package}
# A guest bundle so the agent can boot VMs at once; the agent serves without
# one (its probe says so), so a failed build does not stop the machine joining.
/opt/fuse/bin/fuse bundle build --state-dir /var/lib/fuse-host || echo "fuse: no guest bundle built" >&2

# KillMode=process: VMs are daemonised QEMU processes in the unit's cgroup and
# must survive an agent restart (the agent adopts them again).
cat > /etc/systemd/system/fuse-host.service <<'FUSE_UNIT_EOF'
[Unit]
Description=fuse host agent
Wants=network-online.target
After=network-online.target

[Service]
EnvironmentFile=/etc/fuse-host/env
ExecStart=/opt/fuse/bin/fuse host serve --listen 0.0.0.0:{port} --state-dir /var/lib/fuse-host --backend qemu
Restart=always
RestartSec=2
KillMode=process

[Install]
WantedBy=multi-user.target
FUSE_UNIT_EOF
systemctl daemon-reload
systemctl enable --now fuse-host.service
"""


def user_data(*, agent_port: int, agent_token: str, package: str) -> str:
    """The cloud-init script a new instance runs (see ``USER_DATA``)."""
    return USER_DATA.format(token=agent_token, port=agent_port, package=shlex.quote(package))


def _priced_regions() -> list[str]:
    return sorted({o.region for o in default_catalogue() if o.provider == "aws"})


class AwsProvider(Provider):
    """EC2 in one region, priced from the shipped catalogue."""

    kind = "aws"
    OPTIONS = frozenset({"region", "image_id", "endpoint_url", "access_key_id", "secret_access_key",
                         "session_token", "key_name", "security_group_ids", "subnet_id", "agent_port", "types",
                         "package"}) | CAP_OPTIONS
    REQUIRED = ("image_id",)
    SECRETS = frozenset({"secret_access_key", "session_token"})
    backend = "qemu"  # KVM on metal types, TCG elsewhere: the agent's probe settles which

    def __init__(self, name: str, options: dict[str, Any], state_dir: Any = None):
        r = OptionReader(self.kind, options, self.OPTIONS, required=self.REQUIRED)
        self.name = name
        self.region = r.str("region", DEFAULT_REGION)
        if self.region not in _priced_regions():
            raise r.bad("region", f"names {self.region!r}, which the shipped catalogue has no prices for "
                                  f"(priced: {', '.join(_priced_regions())})")
        self.amis = self._amis(r)  # arch -> AMI (``images()`` is the guest bundles its machines get)
        self.endpoint_url = r.str("endpoint_url")
        if self.endpoint_url and not self.endpoint_url.startswith(("http://", "https://")):
            raise r.bad("endpoint_url", "must be an http:// or https:// URL")
        self._key_id, self._secret = r.str("access_key_id"), r.str("secret_access_key")
        self._session_token = r.str("session_token")
        if bool(self._key_id) != bool(self._secret):
            raise r.bad("secret_access_key" if self._key_id else "access_key_id",
                        "is required with the other (access_key_id and secret_access_key go together)")
        if self._session_token and not self._key_id:
            raise r.bad("session_token", "needs access_key_id and secret_access_key")
        self.key_name, self.subnet_id = r.str("key_name"), r.str("subnet_id")
        self.security_group_ids = r.str_list("security_group_ids")
        self.agent_port = r.int("agent_port", DEFAULT_AGENT_PORT, minimum=1, maximum=65535)
        self.package = r.str("package", f"fuse-fleet=={__version__}")
        if any(c.isspace() for c in self.package):
            raise r.bad("package", "must be one pip requirement (no spaces)")
        # the catalogue's families are AWS's vCPU quotas (``aws:standard``): here, this cloud's (``capped``)
        here = [o.model_copy(update={"provider": name, "quota_family": o.quota_family.partition(":")[2]
                                     or o.quota_family}) for o in default_catalogue()
                if o.provider == "aws" and o.region == self.region]
        types = r.str_list("types")
        if types == []:
            raise r.bad("types", "is empty: name at least one machine type, or leave it out for all")
        if types is not None:
            known = {o.type_name for o in here}
            if unknown := [t for t in types if t not in known]:
                raise r.bad("types", f"names {', '.join(unknown)}, not in the catalogue for {self.region}")
            here = [o for o in here if o.type_name in set(types)]
        offered = [o for o in here if o.arch in self.amis]
        if not offered:
            archs = sorted({o.arch for o in here})
            raise r.bad("image_id", f"has no AMI for {' or '.join(archs)}, the architecture of the types offered")
        self._offers = self.capped(r, offered)
        self._single_ami = isinstance(r.options["image_id"], str)
        self._roots: dict[str, str] = {}  # AMI -> its root device name (DescribeImages), once asked
        self._client = None
        self._client_lock = threading.Lock()
        self._fresh: dict[str, float] = {}  # instance id -> when this provider created it

    @staticmethod
    def _amis(r: OptionReader) -> dict[str, str]:
        """arch -> AMI. A mapping ({"amd64": ..., "arm64": ...}) limits the offers
        to the architectures it names, so the planner never picks a type the AMI
        cannot boot. A single id's architecture is EC2's to say (``check``): until
        asked (a provider made by hand, not through the pool's link) it stands for
        both."""
        value = r.options["image_id"]
        if isinstance(value, str):
            return {"amd64": value, "arm64": value}
        if isinstance(value, dict) and value and all(k in ("amd64", "arm64") and isinstance(v, str) and v
                                                     for k, v in value.items()):
            return dict(value)
        raise r.bad("image_id", "must be an AMI id, or an object of AMI ids by arch (amd64, arm64)")

    def offers(self) -> list[Offer]:
        return list(self._offers)

    async def check(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Ask EC2 for the AMIs (DescribeImages, the link's only calls): the endpoint
        and credentials work (CloudError with the cloud's reason otherwise), each
        AMI is there in the region and of the architecture it stands for, EBS-backed
        (InvalidArgument naming ``image_id`` otherwise). The options to store: a
        single id becomes ``{its arch: id}``, so only the types it boots are offered."""
        images, missing = {}, {}
        for ami in sorted(set(self.amis.values())):  # one call each: EC2 fails a call on any unknown id
            try:
                images |= await asyncio.to_thread(self._images, [ami])
            except CloudError as exc:
                if exc.details.get("cloud_code") not in NO_AMI_CODES:
                    raise
                missing[ami] = exc.details["cloud_code"]
        single = self._single_ami
        resolved: dict[str, str] = {}
        for arch, ami in sorted(self.amis.items()):
            where = "image_id" if single else f"image_id.{arch}"
            image = images.get(ami)
            if image is None:
                raise self._bad_image(where, f"names {ami}, which EC2 does not have in {self.region}, or not "
                                             f"for this account ({missing.get(ami, 'not listed')})")
            got = ARCHS.get(image.get("Architecture", ""))
            if got is None:
                raise self._bad_image(where, f"names {ami}, an {image.get('Architecture')!r} image: machines "
                                             f"are amd64 (x86_64) or arm64")
            if not single and got != arch:
                raise self._bad_image(where, f"names {ami}, an {got} image, not {arch}")
            if image.get("RootDeviceType", "ebs") != "ebs":
                raise self._bad_image(where, f"names {ami}, an instance-store image: a machine's root "
                                             f"is an EBS gp3 volume (the prices include one)")
            resolved[got] = ami
        return dict(options) | {"image_id": resolved}

    def _bad_image(self, where: str, why: str) -> InvalidArgument:
        return InvalidArgument(f"option {where!r} of {article(self.kind)} cloud {why}", details={"option": "image_id"})

    def adopt(self, old: Provider) -> None:
        if isinstance(old, AwsProvider):  # ids created moments ago, which EC2 may not list yet
            self._fresh = old._fresh | self._fresh
            self._roots = old._roots | self._roots

    def capacity(self, type_name: str) -> dict[str, int]:
        # A real machine: its agent probes cpus and RAM itself.
        return self.capacity_of(self.offer(type_name, None), None, declare_size=False)

    async def create(self, *, host_name: str, type_name: str, region: str, agent_token: str) -> Machine:
        check_name("host name", host_name)
        offer = self.offer(type_name, region)
        if not isinstance(agent_token, str) or not TOKEN_RE.fullmatch(agent_token):
            raise InvalidArgument("agent_token must be 1-512 characters of A-Z a-z 0-9 . _ ~ + / = -")
        ami = self.amis[offer.arch]
        if ami not in self._roots:
            self._roots[ami] = await self._root_device(ami)
        tags = [{"Key": "Name", "Value": host_name}, {"Key": "fuse-pool", "Value": self.name}]
        kwargs: dict[str, Any] = {
            "ImageId": ami, "InstanceType": offer.type_name, "MinCount": 1, "MaxCount": 1,
            # botocore retries a timed-out call: the same token makes EC2 answer with the instance the
            # first try started instead of starting another. Per machine (its agent token is its own).
            "ClientToken": hashlib.sha256(f"{host_name}\0{agent_token}".encode()).hexdigest()[:64],
            "UserData": user_data(agent_port=self.agent_port, agent_token=agent_token, package=self.package),
            # A guest that shuts down ends its machine: a stopped one would bill on, doing nothing.
            "InstanceInitiatedShutdownBehavior": "terminate",
            # The tags let an operator (or a later reconcile) find what the pool bought, disk included.
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags},
                                  {"ResourceType": "volume", "Tags": tags}],
        }
        if offer.disk_gb:  # the root volume the offer's price includes, not the AMI's default
            kwargs["BlockDeviceMappings"] = [{"DeviceName": self._roots[ami], "Ebs": {
                "VolumeSize": offer.disk_gb, "VolumeType": "gp3", "DeleteOnTermination": True}}]
        if self.key_name:
            kwargs["KeyName"] = self.key_name
        if self.security_group_ids:
            kwargs["SecurityGroupIds"] = self.security_group_ids
        if self.subnet_id:
            kwargs["SubnetId"] = self.subnet_id
        reply = await asyncio.to_thread(self._call, "run_instances", **kwargs)
        instance_id = reply["Instances"][0]["InstanceId"]
        now = time.monotonic()
        self._fresh = {i: t for i, t in self._fresh.items() if now - t < FRESH_SECS}
        self._fresh[instance_id] = now
        return Machine(instance_id, "pending")

    async def describe(self, ids: list[str]) -> dict[str, Machine]:
        if not ids:
            return {}
        seen = await asyncio.to_thread(self._describe, list(dict.fromkeys(ids)))
        now = time.monotonic()
        out = {}
        for i in ids:
            if i in seen:
                out[i] = seen[i]
            elif now - self._fresh.get(i, -FRESH_SECS) < FRESH_SECS:
                out[i] = Machine(i, "pending")  # created moments ago; not listed yet
            else:
                out[i] = Machine(i, "terminated")
        return out

    async def find(self, host_name: str) -> list[Machine]:
        """By the tags ``create`` gives an instance: ``Name`` (the host) and ``fuse-pool`` (this cloud)."""
        check_name("host name", host_name)
        return await asyncio.to_thread(self._find, host_name)

    async def terminate(self, machine_id: str) -> None:
        if not isinstance(machine_id, str) or not machine_id:
            raise InvalidArgument("machine id must be a non-empty string")
        await asyncio.to_thread(self._terminate, machine_id)

    async def close(self) -> None:
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None and hasattr(client, "close"):
            await asyncio.to_thread(client.close)

    async def _root_device(self, ami: str) -> str:
        images = await asyncio.to_thread(self._images, [ami])
        if ami not in images or not images[ami].get("RootDeviceName"):
            raise CloudError(f"aws describe_images: {ami} is gone from {self.region} (re-link with another "
                             f"image_id)", details={"cloud_code": "InvalidAMIID.NotFound"})
        return images[ami]["RootDeviceName"]

    # -- blocking parts, run in threads --------------------------------------

    def _images(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        # (EC2 fails the call on an unknown id; some endpoints leave it out instead)
        reply = self._call("describe_images", ImageIds=ids)
        return {i["ImageId"]: i for i in reply.get("Images", []) if i.get("ImageId") in ids}

    def _ec2(self):
        with self._client_lock:
            if self._client is None:
                import boto3
                from botocore.config import Config
                session = boto3.session.Session(aws_access_key_id=self._key_id, aws_secret_access_key=self._secret,
                                                aws_session_token=self._session_token, region_name=self.region)
                # Bounded: an unreachable endpoint must fail a call in seconds, not hang a reconcile.
                config = Config(connect_timeout=5, read_timeout=30, user_agent_extra="fuse-pool",
                                retries={"max_attempts": 3, "mode": "standard"})
                self._client = session.client("ec2", endpoint_url=self.endpoint_url, config=config)
            return self._client

    def _call(self, op: str, **kwargs: Any) -> dict[str, Any]:
        from botocore.exceptions import BotoCoreError, ClientError
        try:
            return getattr(self._ec2(), op)(**kwargs)
        except ClientError as exc:
            err = exc.response.get("Error", {})
            code = err.get("Code", "Unknown")
            raise CloudError(self._scrub(f"aws {op}: {code}: {err.get('Message', '')}"),
                             details={"cloud_code": code}) from None
        except BotoCoreError as exc:
            raise CloudError(self._scrub(f"aws {op}: {type(exc).__name__}: {exc}"),
                             details={"cloud_code": type(exc).__name__}) from None

    def _scrub(self, message: str) -> str:
        # Belt and braces: AWS never echoes a secret, but a message must not carry one even if it did.
        for secret in (self._secret, self._session_token):
            if secret:
                message = message.replace(secret, "***")
        return message

    def _describe(self, ids: list[str]) -> dict[str, Machine]:
        # A filter, not InstanceIds: one unknown id would fail the whole call
        # (InvalidInstanceID.NotFound); a filter simply leaves it out.
        out: dict[str, Machine] = {}
        for start in range(0, len(ids), DESCRIBE_CHUNK):
            token = None
            while True:
                kwargs: dict[str, Any] = {"Filters": [{"Name": "instance-id",
                                                       "Values": ids[start:start + DESCRIBE_CHUNK]}]}
                if token:
                    kwargs["NextToken"] = token
                reply = self._call("describe_instances", **kwargs)
                for reservation in reply.get("Reservations", []):
                    for inst in reservation.get("Instances", []):
                        out[inst["InstanceId"]] = self._machine(inst)
                token = reply.get("NextToken")
                if not token:
                    break
        return out

    def _find(self, host_name: str) -> list[Machine]:
        filters = [{"Name": "tag:Name", "Values": [host_name]}, {"Name": "tag:fuse-pool", "Values": [self.name]},
                   {"Name": "instance-state-name", "Values": [s for s in STATES if s != "terminated"]}]
        out, token = [], None
        while True:
            reply = self._call("describe_instances", Filters=filters, **({"NextToken": token} if token else {}))
            out += [self._machine(i) for r in reply.get("Reservations", []) for i in r.get("Instances", [])]
            token = reply.get("NextToken")
            if not token:
                return out

    def _machine(self, inst: dict[str, Any]) -> Machine:
        state = STATES.get(inst.get("State", {}).get("Name", ""), "pending")
        ip = inst.get("PublicIpAddress") or inst.get("PrivateIpAddress") or ""
        address = f"http://{ip}:{self.agent_port}" if state == "running" and ip else ""
        return Machine(inst["InstanceId"], state, address)

    def _terminate(self, machine_id: str) -> None:
        # Right after create, EC2 may not know the id yet: retry a fresh one
        # briefly rather than report a live instance terminated.
        fresh = machine_id in self._fresh and time.monotonic() - self._fresh[machine_id] < FRESH_SECS
        give_up, delay = time.monotonic() + (30.0 if fresh else 0.0), 1.0
        while True:
            try:
                self._call("terminate_instances", InstanceIds=[machine_id])
                break
            except CloudError as exc:
                code = exc.details.get("cloud_code")
                if code not in GONE_CODES:
                    raise
                if code != "InvalidInstanceID.NotFound" or time.monotonic() + delay > give_up:
                    break  # unknown to the cloud: already gone
                time.sleep(delay)
                delay = min(delay * 2, 8.0)
        self._fresh.pop(machine_id, None)
