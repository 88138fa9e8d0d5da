"""Cloud providers of the elastic pool: link a cloud by kind, name and options.

    link("aws", "aws-west", {"image_id": "ami-..."}, state_dir) -> AwsProvider
    link("local", "dev", {"backend": "fake"}, state_dir)          -> LocalProvider

``KINDS`` is the explicit kind → class registry (no discovery). The AWS module
imports boto3 only when a call needs it, so importing this package is cheap.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fuse.errors import InvalidArgument

from .aws import AwsProvider
from .base import CloudError, Machine, Provider, check_name
from .local import LocalProvider

__all__ = ["KINDS", "AwsProvider", "CloudError", "LocalProvider", "Machine", "Provider", "link",
           "options_help", "public_options"]

KINDS: dict[str, type[Provider]] = {"aws": AwsProvider, "local": LocalProvider}


def _kind(kind: str) -> type[Provider]:
    try:
        return KINDS[kind]
    except (KeyError, TypeError):
        raise InvalidArgument(f"unknown cloud kind {kind!r} (kinds: {', '.join(sorted(KINDS))})",
                              details={"option": "kind"}) from None


def link(kind: str, name: str, options: Mapping[str, Any] | None, state_dir: Path) -> Provider:
    """A provider for one linked cloud, its options checked (InvalidArgument
    names the bad one). ``state_dir`` is the controller's state dir for this
    cloud: the local provider keeps its machines there."""
    cls = _kind(kind)
    check_name("cloud name", name)
    return cls(name, options or {}, Path(state_dir))


def options_help() -> str:
    """Every kind's options, from its ``OPTIONS`` (required ones first): "aws: image_id
    (required), access_key_id, ... local: ..." (``fuse pool cloud link --help``)."""
    parts = []
    for kind, cls in sorted(KINDS.items()):
        rest = sorted(cls.OPTIONS - set(cls.REQUIRED))
        parts.append(f"{kind}: " + ", ".join([f"{o} (required)" for o in cls.REQUIRED] + rest) + ".")
    return " ".join(parts)


def public_options(kind: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The options fit to show (GET): secrets removed. Anything named like a
    secret or token goes too, so an option added later cannot leak by default."""
    secrets = _kind(kind).SECRETS
    return {k: v for k, v in (options or {}).items()
            if k not in secrets and "secret" not in k.lower() and "token" not in k.lower()}
