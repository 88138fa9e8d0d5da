"""What the elastic pool asks of a cloud: the ``Provider`` interface.

A provider adds and removes machines in one linked cloud and says which
machine types it can add (its offers, the planner's input). It does not track
them: the elastic-host service owns the lifecycle (creating → booting →
joined → cordoned → offline → gone) and calls a provider for the cloud facts
it cannot know itself — create, describe, terminate, and find: the machines a
create started under a host's name, for a controller that stopped before it
stored the id the create returned.

    Provider
     ├── LocalProvider   kind "local": host agents on this machine (dev, tests, demos)
     └── AwsProvider     kind "aws":   EC2 instances through boto3

Options arrive as a plain dict (the API's ``options`` object) and are checked
by ``OptionReader``: an unknown option, a missing required one or a bad value
raises ``InvalidArgument`` naming it, before anything is bought.

Every kind takes two caps among its options (``CAP_OPTIONS``), read by
``Provider.capped``: ``quotas`` ({quota family: vCPUs}, as a cloud's vCPU quotas
are: AWS's "Running On-Demand Standard instances" is family ``standard``) and
``limits`` ({machine type: machines}). A cloud's families are its own: its
offers' ``quota_family`` is ``<cloud name>:<family>`` (``aws:standard``), so two
linked AWS accounts never share a quota. The pool counts the machines it runs in
the cloud against them (``ElasticPool.constraints``, ``ElasticPool.offers``).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from fuse.controller.pool.model import Offer
from fuse.errors import FuseError, InvalidArgument

MACHINE_STATES = ("pending", "running", "stopping", "terminated")
CAP_OPTIONS = frozenset({"quotas", "limits"})  # options of every kind (``Provider.capped``)
MAX_CAP = 2**32 - 1  # a quota or a limit is a u32, as the seed's counts are
# Names become directory names (local) and tag values (aws): no slashes, no
# leading dot, so a name can never climb out of the provider's state dir.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


@dataclass(frozen=True)
class Machine:
    """One cloud machine as the cloud sees it now."""

    id: str  # the cloud's id for the machine
    state: str  # "pending" | "running" | "stopping" | "terminated"
    address: str = ""  # the host agent's URL once known ("http://10.0.0.5:8090"); "" before


class CloudError(FuseError):
    """The cloud refused or failed. The message says what the cloud said,
    never a credential."""

    code, http_status = "cloud_error", 502


def article(word: str) -> str:
    """``word`` with its indefinite article, as it is read aloud: "an aws", "a local"."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def check_name(what: str, value: Any) -> str:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise InvalidArgument(f"{what} {value!r} is not a valid name (letters, digits, '.', '_', '-'; "
                              "at most 63; starting with a letter or digit)")
    return value


class OptionReader:
    """Reads a provider's options, naming the option in every refusal."""

    def __init__(self, kind: str, options: Mapping[str, Any] | None, known: frozenset[str],
                 required: tuple[str, ...] = ()):
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise InvalidArgument(f"options of {article(kind)} cloud must be an object")
        self.kind, self.options = kind, dict(options)
        unknown = sorted(set(self.options) - known)
        if unknown:
            raise InvalidArgument(f"unknown option {unknown[0]!r} for {article(kind)} cloud (its options: "
                                  f"{', '.join(sorted(known))})", details={"option": unknown[0]})
        for key in required:
            if self.options.get(key) in (None, ""):
                raise self.bad(key, "is required")

    def bad(self, key: str, why: str) -> InvalidArgument:
        return InvalidArgument(f"option {key!r} of {article(self.kind)} cloud {why}", details={"option": key})

    def has(self, key: str) -> bool:
        return self.options.get(key) is not None

    def str(self, key: str, default: str | None = None, *, choices: tuple[str, ...] | None = None) -> str | None:
        value = self.options.get(key, default)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.bad(key, "must be a non-empty string")
        if choices and value not in choices:
            raise self.bad(key, f"must be one of {', '.join(choices)} (got {value!r})")
        return value

    def int(self, key: str, default: int | None = None, *, minimum: int = 0, maximum: int | None = None) -> int | None:
        value = self.options.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum or \
                (maximum is not None and value > maximum):
            limit = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
            raise self.bad(key, f"must be an integer {limit} (got {value!r})")
        return value

    def caps(self, key: str, known: list[str], what: str, whats: str) -> dict[str, int]:
        """An object of ``what`` (one of ``known``, its ``whats``) -> a non-negative integer, or {} when unset."""
        value = self.options.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.bad(key, f"must be an object of {what} -> a non-negative integer "
                                f"(its {whats}: {', '.join(known) or 'none'})")
        out = {}
        for name, n in value.items():
            if name not in known:
                raise self.bad(key, f"names {name!r}, not a {what} of this cloud (its {whats}: "
                                    f"{', '.join(known) or 'none'})")
            if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_CAP:
                raise self.bad(f"{key}.{name}", f"must be an integer from 0 to {MAX_CAP} (got {n!r})")
            out[name] = n
        return out

    def str_list(self, key: str) -> list[str] | None:
        value = self.options.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.bad(key, "must be a list of non-empty strings")
        return list(value)


U32 = 2**32 - 1  # the planner's figures (sizes, seconds, counts) are u32, as the seed types them


def number(where: str, value: Any, *, minimum: float = 0, integer: bool = False, maximum: float = U32) -> Any:
    """A number from an option's nested field (``types[0].vcpus``): finite, and at most
    ``maximum`` (a type of 2^63 MiB linked fine, then broke every plan with a 500)."""
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not minimum <= value <= maximum:
        kind = "an integer" if integer else "a number"
        raise InvalidArgument(f"option {where} must be {kind} from {minimum:g} to {maximum:g} (got {value!r})",
                              details={"option": where})
    return value


class Provider(ABC):
    """One linked cloud. Safe to call from several coroutines at once."""

    kind: ClassVar[str]
    OPTIONS: ClassVar[frozenset[str]] = frozenset()  # every option it takes (``options_help`` lists them)
    REQUIRED: ClassVar[tuple[str, ...]] = ()  # those of them a link must give
    SECRETS: ClassVar[frozenset[str]] = frozenset()

    name: str  # the linked cloud's name: the ``provider`` of its offers and ElasticHost records
    backend: str  # the host agent backend its machines run ("qemu", or "fake")
    # vCPUs per quota family (``<cloud>:<family>``, as its offers' quota_family) its machines may
    # run in all; families not named have no quota here (``capped`` sets it)
    quotas: dict[str, int] = {}

    def capped(self, r: OptionReader, offers: list[Offer]) -> list[Offer]:
        """``offers`` (their ``quota_family`` the cloud's own short name: ``standard``) with the
        link's caps: the family becomes ``<cloud>:<family>``, ``limits`` sets each type's
        ``limit``, and ``quotas`` is kept on the provider keyed like the families. Families and
        types must be the offers' own (InvalidArgument naming the option otherwise)."""
        quotas = r.caps("quotas", sorted({o.quota_family for o in offers}), "quota family", "quota families")
        limits = r.caps("limits", sorted({o.type_name for o in offers}), "machine type", "machine types")
        self.quotas = {f"{self.name}:{family}": n for family, n in quotas.items()}
        return [o.model_copy(update={"quota_family": f"{self.name}:{o.quota_family}",
                                     "limit": limits.get(o.type_name)}) for o in offers]

    async def check(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Ask the cloud whether the link made of ``options`` works, before the pool stores
        it: the options to store (as given, or resolved as the kind says), or InvalidArgument
        naming a bad option, or CloudError with the cloud's reason. The default asks nothing."""
        return dict(options)

    def adopt(self, old: Provider) -> None:
        """Take over what ``old`` (this cloud as linked before: its caps re-set while it has
        machines) knows of the machines it started and the cloud may not say yet."""

    @abstractmethod
    def offers(self) -> list[Offer]:
        """Machine types it can add (``Offer.provider == self.name``)."""

    def images(self) -> set[str]:
        """The guest bundles its machines have once they join (``fuse bundle build``'s
        default, ``linux``, unless a kind says otherwise)."""
        return {"linux"}

    @abstractmethod
    def capacity(self, type_name: str) -> dict[str, int]:
        """What the controller declares when it registers a machine's agent:
        ``{"vm_count": n > 0, "cpus": n (0 = probe), "ram_mb": n (0 = probe)}``."""

    @abstractmethod
    async def create(self, *, host_name: str, type_name: str, region: str, agent_token: str) -> Machine:
        """Start one machine whose agent will accept ``agent_token``."""

    @abstractmethod
    async def describe(self, ids: list[str]) -> dict[str, Machine]:
        """Each id's machine now; ids the cloud no longer knows are terminated."""

    @abstractmethod
    async def find(self, host_name: str) -> list[Machine]:
        """The machines, not terminated, that a ``create`` for ``host_name`` started in this
        cloud (by the name or tag it gave them), whether or not their id was ever read."""

    @abstractmethod
    async def terminate(self, machine_id: str) -> None:
        """Remove a machine for good (idempotent: a gone machine is fine)."""

    async def close(self) -> None:
        """Release clients. Machines keep running: they outlive the controller."""

    def offer(self, type_name: str, region: str | None) -> Offer:
        """The offer for ``type_name`` in ``region`` (falsy: its only region),
        or InvalidArgument naming what this cloud has instead."""
        mine = self.offers()
        of_type = [o for o in mine if o.type_name == type_name]
        if not of_type:
            raise InvalidArgument(f"cloud {self.name!r} has no machine type {type_name!r} (it has: "
                                  f"{', '.join(sorted({o.type_name for o in mine})) or 'none'})")
        for o in of_type:
            if not region or o.region == region:
                return o
        raise InvalidArgument(f"cloud {self.name!r} has no region {region!r} for {type_name} (it has: "
                              f"{', '.join(sorted({o.region for o in of_type}))})")

    def capacity_of(self, offer: Offer, vm_count: int | None, *, declare_size: bool) -> dict[str, int]:
        """The capacity record: ``vm_count`` policy (default 4 per vCPU), and
        cpus/ram_mb declared from the type or left to the probe (0)."""
        return {"vm_count": vm_count or 4 * offer.vcpus,
                "cpus": offer.vcpus if declare_size else 0,
                "ram_mb": offer.mem_mib if declare_size else 0}
