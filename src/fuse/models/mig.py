"""MIG profile names as NVIDIA's mig-parted reads them.

A name is ``<C>c.<G>g.<M>gb`` (C compute slices of a G-slice GPU instance
with M GB) or ``<G>g.<M>gb`` (C = G), optionally followed by ``+`` and a
comma-separated list of attributes (``1g.10gb+me``, ``4g.40gb+gfx``,
``1g.23gb+me.all``) or by ``-`` and the attributes the profile lacks
(``1g.23gb-me``). These are the rules of mig-parted's ParseMigProfile (now
go-nvlib's), made stricter where they let nonsense through: slice counts are
the ones NVML has (1, 2, 3, 4, 6, 7, 8) with C <= G, and numbers are written
without signs or leading zeros.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SLICES = frozenset({1, 2, 3, 4, 6, 7, 8})

_FIELDS = re.compile(r"(?:([1-9][0-9]*)c\.)?([1-9][0-9]*)g\.([1-9][0-9]*)gb", re.ASCII)
# Alphanumeric, not starting with a digit; dots only inside (go-nvlib's `me.all`).
_ATTRIBUTE = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:\.[A-Za-z0-9]+)*", re.ASCII)


@dataclass(frozen=True)
class MigProfile:
    compute_slices: int
    gpu_slices: int
    memory_gb: int
    attributes: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()  # attributes after `-`: what the profile lacks


def parse_mig_profile(name: str) -> MigProfile:
    """The profile `name` spells, or ValueError saying what is wrong with it."""
    if not name:
        raise ValueError("the name is empty")
    if "+" in name and "-" in name:
        raise ValueError("it has both + and - attributes")
    sign = "+" if "+" in name else "-"
    fields, sep, attr_text = name.partition(sign)
    m = _FIELDS.fullmatch(fields)
    if m is None:
        raise ValueError("expected <C>c.<G>g.<M>gb or <G>g.<M>gb, numbers without signs or leading zeros")
    g, gb = int(m.group(2)), int(m.group(3))
    c = int(m.group(1)) if m.group(1) else g
    for what, n in (("compute", c), ("GPU instance", g)):
        if n not in SLICES:
            raise ValueError(f"{n} is not a {what} slice count (one of {', '.join(map(str, sorted(SLICES)))})")
    if c > g:
        raise ValueError(f"{c} compute slices do not fit a {g}-slice GPU instance")
    attrs: tuple[str, ...] = ()
    if sep:
        attrs = tuple(attr_text.split(","))
        for a in attrs:
            if not _ATTRIBUTE.fullmatch(a):
                raise ValueError(f"attribute {a!r} is not alphanumeric (e.g. me, gfx, me.all)")
        if len(set(attrs)) != len(attrs):
            raise ValueError("an attribute is repeated")
    if sign == "-":
        return MigProfile(c, g, gb, absent=attrs)
    return MigProfile(c, g, gb, attributes=attrs)


def mig_profile_problem(name: str) -> str | None:
    """Why `name` is not a MIG profile name, or None when it is one."""
    try:
        parse_mig_profile(name)
    except ValueError as exc:
        return str(exc)
    return None
