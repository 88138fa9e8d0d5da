"""`fuse mcp`: an MCP server (stdio) with one tool, `fuse_controller`.

The tool is a thin pipe to the controller's REST API: an agent names the
method, path and body, and gets back the HTTP status and the JSON answer,
errors included — a 409 is an answer to reason about, not a failure of the
tool. The tool's description carries the contract an agent needs to act on
those answers (seed 004). Only failures to reach the controller at all are
tool errors.

The connection is fuse's own client plumbing: `unix:///path` (the
controller's owner-only socket, the default) or `http(s)://host:port` with a
bearer token; `$FUSE_URL` / `$FUSE_TOKEN` when not given.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import parse_qsl

import httpx
from pydantic import WithJsonSchema

from .. import __version__
from ..client import _core
from ..client.pool import POOL_TIMEOUT

TOOL_NAME = "fuse_controller"
ARGUMENTS = ("method", "path", "body")
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
TOP_LEVEL = ("/openapi.json",)  # the controller's route outside /v1/
REQUEST_TIMEOUT = 60.0  # a call's answer, unless it waits on the fleet (``call_timeout``)

INSTRUCTIONS = """\
fuse controls a fleet of microVM hosts. Use the fuse_controller tool to call
the controller's REST API: register hosts, place VMs (best fit), sleep/wake
and move them, read merged events and usage, plan and buy cloud machines
under a budget (the elastic pool), and keep VMs prewarmed."""

DESCRIPTION = """\
Call the fuse fleet controller's REST API and return {"status": <HTTP status>, "body": <JSON answer or null>}.
method: GET, POST, PUT, PATCH or DELETE; path: relative, starting /v1/ (or /openapi.json), sent as written (no '.' or '..' segments; percent-encode ? in an id), with any query string; body: JSON or omitted.
Errors are answers too: body is {"error": {"code", "message", ...}}; act on the code. A code's extras (hosts on
fleet_full) are both beside code and under error.details.

Resources:
- POST /v1/hosts {"name", "addr"} (addr: local | ssh://user@host[:port] | host:port | http://host:port) or
  {"id", "url", "token", "backend", "capacity": {"vm_count": N}} -> 201 host. GET /v1/hosts, GET|DELETE /v1/hosts/{id},
  POST /v1/hosts/{id}?action=cordon|uncordon|drain.
- POST /v1/vms {"name"?, "shape": {"vcpus", "mem_mib"}, "entry": "<command>", "bundle"?, "host"?, "on"?} -> 201
  {name, host, state, ...} ("host" pins it). "on": auto (default: any host, a prewarmed VM first; with the budget's
  autoscale on, the pool buys a machine if none has room) | local (own hosts) | <linked cloud> | host:<machine>.
  GET /v1/vms[?host=], GET|DELETE /v1/vms/{name}[?host=],
  POST /v1/vms/{name}/sleep|wake[?host=], GET /v1/vms/{name}/console?offset=N[&host=].
- POST /v1/moves {"vm", "to"?, "host"?} -> 202 move, running in the background: "to" is the target host (default: best
  fit), "host" the VM's current host when its name is on several; "flashvm" is accepted in place of "vm".
  GET /v1/moves, GET /v1/moves/{id}: state starting|sleeping|copying|waking, then done or failed.
- GET /v1/events?since=<cursor>&wait_s=<long-poll seconds> -> {"events": [...], "next_cursor": <cursor>, "next":
  <the same>}; pass next_cursor as since.
- GET /v1/usage?from=<unix time>[&to=<unix time>] -> {"from", "to" (unix seconds), "vms": [rows tagged with host],
  "totals", "hosts", "aliases", "unreachable": [host names that did not answer], "unreachable_reasons": {host: why}}.
- GET|PUT /v1/controller.
- Elastic pool (cloud machines bought under a budget): POST /v1/pool/plan {"count"?, "image"?, "cpus"?,
  "memory_mb"?, "provider"?, "region"?, "instance_type"?, "no_scale"?, "max_usd_per_hour"?, "apply"?, ...} -> plan
  {assignments, new_hosts, unplaced (with reasons), projected_usd, explain}; buys only with "apply": true (the machines
  in "added"). GET /v1/pool/clouds -> {"clouds": [{name, kind, options, types}]}; PUT /v1/pool/clouds/{name}
  {"kind": "aws"|"local", "options"} links one; DELETE /v1/pool/clouds/{name} -> 204.
  GET /v1/pool/hosts[?all=true] -> {"hosts": [{name, provider, type_name, state, usd_per_hour, expires, ...}]}, state
  creating|booting|joined|cordoned|offline|gone; POST /v1/pool/hosts {"provider", "instance_type", "region"?,
  "count"?, "ttl_hours"?} -> 201 {"hosts"} (they join as they boot); POST /v1/pool/hosts/remove {"names"} ->
  {"removed", "failed": ["<name>: <why>"]}. GET /v1/pool/budget; PATCH /v1/pool/budget {"max_usd_per_hour"?,
  "monthly_usd"?, "max_new_hosts"? (0 = no cap), "autoscale"?, "warm"?, "allow_metal"?} -> the whole budget.
  POST /v1/pool/reconcile -> {"decisions": [{host, action: keep|cordon|remove, reason}]} (one scale-in pass).
- Prewarm (VMs kept booted so the next create of that shape starts at once): POST /v1/prewarms {"image", "count"?,
  "on"?, "kind"?, "cpus"?, "memory_mb"?, "ttl_secs"?, "instance_type"?, "region"?} -> 201 {id, count, ready,
  placements, ...}; GET /v1/prewarms -> {"prewarms"}; DELETE /v1/prewarms/{id} -> 204 or 404.

Contract:
- Placement with no host able to take the VM: 409 fleet_full, error.hosts maps each host to its reason.
- A name already used on the chosen host: 409 vm_exists.
- A VM name on several hosts: 409 ambiguous_vm (error.hosts lists them) unless a host picks one: ?host= on
  /v1/vms/{name} calls, "host" in the body of POST /v1/moves.
- POST /v1/moves: 202 with the move, or 409 not_movable, same_host, unknown_host, arch_mismatch, no_target,
  move_in_progress or host_unreachable. A failed move wakes the VM back on its source.
- Adding a host that cannot be reached: 502 host_unreachable with the reason.
- Elastic pool and prewarm: 409 budget_exceeded (the message names the cap; nothing is bought), 409 fleet_full (a
  prewarm the hosts and pins cannot fit), 409 conflict (unlinking a cloud that has hosts), 502 cloud_error (the cloud
  refused or failed), 400 invalid_argument (no such linked cloud, type or region; apply with none linked).
- Bad input: 400 invalid_argument; unknown name: 404 not_found."""


def call_timeout(method: str, path: str, default: float = REQUEST_TIMEOUT) -> float:
    """How long a call may take to answer: as long as the SDK's method for it waits (its
    work may take that long; cut short, it would go on at the controller unseen), else
    ``default``, so a controller that hangs is a tool error within a minute, not five."""
    route, _, query = path.partition("?")
    parts = route.strip("/").split("/")
    params = dict(parse_qsl(query))
    if route == "/v1/events":
        try:
            return max(0.0, min(float(params.get("wait_s", 0)), 60.0)) + 30.0
        except ValueError:
            return default
    if parts[:2] == ["v1", "vms"]:
        if method == "POST" and len(parts) == 2:
            return 900.0  # a create waits for its VM to boot
        if method == "POST" and len(parts) == 4 and parts[3] in ("sleep", "wake"):
            return 600.0  # (the SDK's: the controller's wait for a 16 GiB VM, and a minute)
        if method == "DELETE" and len(parts) == 3:
            return 120.0
    if route == "/v1/moves" and method == "POST":
        return 120.0
    if parts[:2] == ["v1", "hosts"] and method == "POST" and params.get("action") == "drain":
        return 3600.0
    if parts[:2] in (["v1", "pool"], ["v1", "prewarms"]):
        return POOL_TIMEOUT  # every pool call, reads too (a read may wait on a cloud's answer)
    return default


class ControllerCaller:
    """Performs one REST call on the controller and returns (status, JSON)."""

    def __init__(self, url: str | None = None, token: str | None = None, *,
                 transport: httpx.AsyncBaseTransport | None = None, timeout: float = REQUEST_TIMEOUT):
        base, uds = _core.resolve_url(url)
        # (HTTP(S)_PROXY/NO_PROXY as the SDK reads them: never for loopback or a socket)
        self.proxy = None if transport is not None else _core.proxy_for(base, uds)
        self.where = (f"unix://{uds}" if uds else base) + (f" (through the proxy {self.proxy})" if self.proxy else "")
        if transport is None:
            transport = _core.transport(uds, self.proxy, asynchronous=True)
        self.timeout = timeout
        self._http = httpx.AsyncClient(base_url=base, headers=_core.headers(token), timeout=timeout,
                                       transport=transport, limits=_core.LIMITS)

    async def call(self, method: Any, path: Any, body: Any = None) -> dict[str, Any]:
        # (the arguments are checked here, not by the tool's schema types: pydantic's text,
        # several lines and a link, is not an answer an agent reads at a glance)
        if not isinstance(method, str) or method.upper() not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
        method = method.upper()
        if not isinstance(path, str):
            raise ValueError(f"path must be a string such as /v1/vms, not {path!r}")
        if body is not None and not isinstance(body, dict):
            raise ValueError(f"body must be a JSON object (or left out), not {type(body).__name__} {body!r}"[:200])
        path = controller_path(path)
        wait = call_timeout(method, path, self.timeout)
        try:
            resp = await self._http.request(method, path, json=body, timeout=wait)
        except httpx.InvalidURL as exc:  # (e.g. longer than an HTTP client sends)
            raise ValueError(f"path cannot be sent as a URL ({exc}): {path[:80]!r}...") from None
        except httpx.TimeoutException:
            raise ConnectionError(f"no answer from the fuse controller at {self.where} "
                                  f"within {wait:.0f} s") from None
        except httpx.TransportError as exc:
            raise ConnectionError(f"cannot reach the fuse controller at {self.where}: {exc}") from None
        try:
            answer: Any = resp.json() if resp.content else None
        except ValueError:
            answer = resp.text
        return {"status": resp.status_code, "body": answer}

    async def aclose(self) -> None:
        await self._http.aclose()


def controller_path(path: str) -> str:
    """``path`` as the controller route it names, sent as written: relative (an absolute
    URL, or ``//host``, would let a prompt point the controller's token at another server),
    under ``/v1/`` or its OpenAPI document. Nothing in it is rewritten: a trailing ``/`` and
    a ``#`` are part of an id (``#`` goes as ``%23``, not cut off as a fragment), and a ``.``
    or ``..`` segment, which HTTP clients resolve away (``/v1/hosts/x/../y`` would act on
    host ``y``), is refused: a literal one is written ``%2E``. ValueError otherwise."""
    path = path.replace("#", "%23")
    if bad := next((ch for ch in path if ord(ch) < 32 or ord(ch) == 127), None):
        raise ValueError(f"path holds the control character U+{ord(bad):04X} at position {path.index(bad)}: "
                         f"percent-encode it (%{ord(bad):02X}), not {path[:200]!r}")
    route, sep, query = path.partition("?")
    if not route.startswith("/") or route.startswith("//"):
        raise ValueError(f"path must be relative, starting /v1/ (e.g. /v1/vms), not {path!r}")
    if any(seg in (".", "..") for seg in route.split("/")):
        raise ValueError(f"path must name its route under /v1/ as written, without '.' or '..' segments "
                         f"(they would be resolved away; percent-encode a literal one as %2E), not {path!r}")
    if not (route.startswith("/v1/") or route in TOP_LEVEL):
        raise ValueError(f"path must start with /v1/ (e.g. /v1/vms) or be {' or '.join(TOP_LEVEL)}, "
                         f"not {path!r}")
    return route + sep + query


def argument_problem(arguments: dict[str, Any]) -> str | None:
    """Why a call's arguments are not the tool's (one sentence), or None. Checked
    before mcp's argument model sees them: that model drops a name it does not know
    (a misspelt ``bdy`` would send no body at all) and words a missing one as
    pydantic's several lines and a link."""
    unknown = sorted(set(arguments) - set(ARGUMENTS))
    if unknown:
        return f"unknown argument {unknown[0]!r}: the tool takes {', '.join(ARGUMENTS)}"
    for name, example in (("method", "GET"), ("path", "/v1/vms")):
        if name not in arguments:
            return f"{name} is required (e.g. {example})"
    return None


# The tool's arguments as its schema shows them; ``ControllerCaller.call`` checks them.
Method = Annotated[Any, WithJsonSchema({"type": "string", "enum": list(METHODS)})]
Path = Annotated[Any, WithJsonSchema({"type": "string", "description": "a controller route, e.g. /v1/vms"})]
Body = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "object"}, {"type": "null"}], "default": None})]


def build_server(url: str | None = None, token: str | None = None, *,
                 transport: httpx.AsyncBaseTransport | None = None):
    """The MCP server object (mcp's `MCPServer`), its one tool bound to a
    controller."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    class Server(MCPServer):
        async def call_tool(self, name, arguments, context=None):
            # (the tool's own function never sees the raw arguments: see argument_problem)
            if name == TOOL_NAME and (why := argument_problem(arguments)):
                raise ToolError(f"Error executing tool {name}: {why}")
            return await super().call_tool(name, arguments, context)

    caller = ControllerCaller(url, token, transport=transport)
    # WARNING: stderr is the user's terminal or the client's log; one line per
    # request there is noise.
    server = Server(name="fuse", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")

    async def fuse_controller(method: Method, path: Path, body: Body = None) -> dict[str, Any]:
        try:
            return await caller.call(method, path, body)
        except (ValueError, ConnectionError) as exc:  # a bad call, or no controller: say which
            raise ToolError(str(exc)) from None

    server.add_tool(fuse_controller, name=TOOL_NAME, description=DESCRIPTION)
    return server


def serve(url: str | None = None, token: str | None = None) -> None:
    """Serve MCP on stdin/stdout until the client closes it."""
    build_server(url, token).run("stdio")
