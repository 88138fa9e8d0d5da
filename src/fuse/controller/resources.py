"""Resources: the one value type for "how much" (never a dict of floats)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resources:
    vcpus: int = 0
    mem_mib: int = 0
    count: int = 0  # VMs

    def __add__(self, o: "Resources") -> "Resources":
        return Resources(self.vcpus + o.vcpus, self.mem_mib + o.mem_mib, self.count + o.count)

    def __sub__(self, o: "Resources") -> "Resources":
        return Resources(self.vcpus - o.vcpus, self.mem_mib - o.mem_mib, self.count - o.count)

    def fits(self, room: "Resources") -> bool:
        """Memory is the hard limit; vCPUs are time-shared and never refuse."""
        return self.mem_mib <= room.mem_mib

    @classmethod
    def vm(cls, vcpus: int, mem_mib: int) -> "Resources":
        return cls(vcpus, mem_mib, 1)
