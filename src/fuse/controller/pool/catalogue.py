"""The default catalogue of offers: machine types a linked cloud can add.

Shipped as ``fuse/data/catalogue_aws.csv``: the AWS EC2 on-demand Linux
us-west-2 rows of the project's ``shared/data/CLOUD-CATALOGUE.md`` (originally
the AWS price list; copied 2026-12-02 — the CSV header's ``source``,
``original source`` and ``date copied`` say so), plus Modal sandboxes as ``one_space`` offers — a one-VM
supplier with no host agent and no KVM, so it can take ``container``-kind work
only, one VM per sandbox, and is not counted as a new host by ``max_new_hosts``.
Live price sources (Hetzner's API) are providers' business, not this file's.
"""

from __future__ import annotations

import csv
from functools import lru_cache
from pathlib import Path

from fuse.controller.pool.model import Offer

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "data" / "catalogue_aws.csv"


def _bool(s: str) -> bool:
    return s.strip().lower() in ("true", "yes", "1")


def load_catalogue(path: str | Path | None = None) -> list[Offer]:
    """Offers from a catalogue CSV (``#`` lines are comments: source and date)."""
    p = Path(path) if path else DEFAULT_PATH
    with p.open(newline="") as fh:
        rows = csv.DictReader(line for line in fh if not line.startswith("#"))
        return [Offer(
            provider=r["provider"], type_name=r["type_name"], region=r["region"], arch=r["arch"],
            vcpus=int(r["vcpus"]), mem_mib=int(r["mem_mib"]), disk_gb=int(r["disk_gb"] or 0),
            gpu=r["gpu"], kvm=_bool(r["kvm"]), metal=_bool(r["metal"]),
            usd_per_hour=float(r["usd_per_hour"]), billing_step_secs=int(r["billing_step_secs"]),
            billing_min_secs=int(r["billing_min_secs"]), boot_secs=int(r["boot_secs"]),
            quota_family=r["quota_family"], one_space=_bool(r["one_space"]),
        ) for r in rows]


@lru_cache(maxsize=1)
def default_catalogue() -> tuple[Offer, ...]:
    """The shipped catalogue, read once."""
    return tuple(load_catalogue())


def catalogue_source() -> dict[str, str]:
    """The ``# key: value`` header of the shipped catalogue (source, original source, date copied)."""
    out = {}
    for line in DEFAULT_PATH.read_text().splitlines():
        if not line.startswith("#"):
            break
        key, _, value = line[1:].partition(":")
        out[key.strip()] = value.strip()
    return out
