"""Integrations with other tools, each behind an optional extra.

`fuse.integrations.mlos.FuseVMService` (extra `mlos`): mlos_bench host
provisioning on a fuse controller. Imported lazily so `import
fuse.integrations` never needs the extra.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FuseVMService"]


def __getattr__(name: str) -> Any:
    if name == "FuseVMService":
        from .mlos import FuseVMService
        return FuseVMService
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
