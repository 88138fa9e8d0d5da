"""One error tree for the whole of fuse.

    FuseError                  (code, http_status)
     ├── InvalidArgument        400 invalid_argument
     ├── Unauthorized           401 unauthorized
     ├── NotFound               404 not_found
     ├── Conflict               409 conflict
     │    ├── HostFull          409 host_full
     │    ├── VmExists          409 vm_exists
     │    ├── FleetFull         409 fleet_full   (details: {"hosts": {host: reason}})
     │    ├── AmbiguousVm       409 ambiguous_vm
     │    └── MoveRefused       409 <code given>  (not_movable, same_host, ...)
     └── HostUnreachable        502 host_unreachable (or the code given)
          └── NotAnAgent        502 host_unreachable (the url answered, not as a fuse agent)

Expected outcomes inside services are values; these exceptions cross the API
boundary. ``error_body`` gives the wire envelope
``{"error": {"code", "message", ...details, "details": {...details}}}`` that the
SDK turns back into ``fuse.ApiError``. An error's extras (``hosts`` on
``fleet_full``) sit both at the top of ``error``, where fuse has always put
them, and under ``error.details``, where the public Fuse API's clients
(folsom-fuse) read them; an error without extras is the bare
``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

from typing import Any


class FuseError(Exception):
    code = "internal"
    http_status = 500

    def __init__(self, message: str, *, code: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details = details or {}

    def with_status(self, status: int) -> "FuseError":
        self.http_status = status
        return self

    def body(self) -> dict[str, Any]:
        return error_body(self.code, self.message, **self.details)


class InvalidArgument(FuseError):
    code, http_status = "invalid_argument", 400


class Unauthorized(FuseError):
    code, http_status = "unauthorized", 401


class NotFound(FuseError):
    code, http_status = "not_found", 404


class Conflict(FuseError):
    code, http_status = "conflict", 409


class HostFull(Conflict):
    code = "host_full"


class VmExists(Conflict):
    code = "vm_exists"


class FleetFull(Conflict):
    code = "fleet_full"


class AmbiguousVm(Conflict):
    code = "ambiguous_vm"


class MoveRefused(Conflict):
    code = "not_movable"


class HostUnreachable(FuseError):
    code, http_status = "host_unreachable", 502


class NotAnAgent(HostUnreachable):
    """Something answered at the host's url, but not a fuse agent's reply: a
    wrong address, not an outage, so registration never goes ahead on it."""


class NotTrusted(HostUnreachable):
    """The host was reached, but trust failed: its SSH host key or TLS certificate is
    not one the controller trusts, or it refused the controller's key or certificate.
    A mistake to fix, not an outage, so registration never goes ahead on it."""


def error_body(code: str, message: str, **details: Any) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message, **details}
    if details:
        err["details"] = dict(details)
    return {"error": err}
