"""Fleet usage (``GET /v1/usage``), for the OpenAPI document.

The route answers the plain dict ``UsageService.usage`` builds; these models
name and describe its fields without touching the JSON on the wire. The
figures are a host's metering (see ``fuse.agent.metering``).
"""

from __future__ import annotations

from pydantic import Field

from .base import Record


class UsageTotals(Record):
    """Sums over the rows, exact (decimal; bytes as integers). Zeros when no
    host answered. Seconds are written as exact JSON number literals, rows
    and totals alike: read them as decimals (Python: ``json.loads(body,
    parse_float=Decimal)``) to keep every digit, since a float keeps about 16
    significant digits. A VM's ``mem_mib_seconds`` is its ``mem_mib`` ×
    its ``wall_seconds``, exactly."""

    cpu_seconds: float = 0.0
    mem_mib_seconds: float = 0.0
    wall_seconds: float = 0.0
    state_bytes_written: int = 0


class UsageRow(UsageTotals):
    """One VM's figures over the window, tagged with its host. A row is one VM:
    a VM deleted and another created under its name are two rows, told apart by
    ``created_at``."""

    host: str
    vm: str
    created_at: str | None = Field(default=None, description=(
        "when the VM was created (as GET /v1/vms shows it); absent on rows a host metered "
        "before it keyed rows by VM"))


class UsageReport(Record):
    """Every answering host's rows and their totals over [from, to)."""

    from_: float = Field(alias="from", description="unix seconds, an integer when whole (0 when not given)")
    to: float = Field(description="unix seconds, an integer when whole (now, rounded up to the second, "
                                  "when not given)")
    vms: list[UsageRow]
    totals: UsageTotals
    hosts: list[str] = Field(description="the hosts asked: one name per machine")
    aliases: dict[str, list[str]] = Field(description="a host -> its other names (same agent), counted once")
    unreachable: list[str] = Field(description="the hosts that did not answer")
    unreachable_reasons: dict[str, str] = Field(description="a host that did not answer -> why")
