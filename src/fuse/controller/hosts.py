"""The host registry (seed 000): register with probing, cordon, drain,
deregister.

Re-registering an id that exists is an update, never a reset: the host keeps
its state (a cordoned or draining host stays so), its creation time and every
VM assigned to it (allocations are derived from those VMs, so they cannot be
zeroed); url, token, region, labels and capacity are replaced by the new
request, re-probed, and last_seen is set again because this is a
registration. Moving an id to another url while VMs are assigned to it, or
while a create placed there waits on the host's answer, is a 409 conflict:
those VMs live (or are landing) on the old machine. Deregistering is refused
for the same reasons. In both, a VM whose run is over (`FINISHED`) does not
hold the host: drain cannot move such a VM, so it would hold the host for
good. A deregister takes it along (its row leaves the controller's store; its
record stays on the agent). A move leaves its row to the host's poller, which
reads the VM list of whatever agent answers at the new url, as it does for an
agent replaced at an address: the same agent still lists it, another does
not and the row goes; its events stay the id's either way. Deregistering is
also refused while a move still needs the host.

One agent identity is one machine only while one agent process answers to it: an
agent-id file copied to another machine (made from an image after its agent ran) is
refused at registration (409), where the agent at another registered address of that
identity answers as another process (each agent reports an ``instance`` of its own).

Nothing is stored that a read of it would fail on: the probe's reply is held
to the bounds a declared capacity is (a reply past them is not an agent's),
and the record a read makes of the new row is made before the row is written.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import Field, StrictInt, StrictStr, ValidationError

from ..errors import Conflict, HostUnreachable, InvalidArgument, NotAnAgent, NotFound, NotTrusted
from ..models.base import Record
from ..models.hosts import BACKENDS, MAX_AMOUNT, GPUDevice, Host, HostCapacity, RegisterHostRequest
from ..models.mig import mig_profile_problem
from ..tokens import token_problem
from ..transport import MAX_FACTS_BYTES, HostConnection, TlsSettings, normalise_address, parse_address
from .resources import Resources
from .pool.model import ARCHES
from .store import Store

PROBED_FIELDS = ("cpus", "ram_mb", "storage_gb")

# VM states (the agent's, models/vm.py's VmState) in which the run is over: no machine runs
# and none can run again without a new create (the agent's TRANSITIONS lead them only to
# "deleted"). exited: the entry finished; failed: the process died or never started;
# deleted: removed. Such a VM does not keep its host from being deregistered. Every other
# state may hold a running machine, or become one by a wake: creating, running, sleeping,
# incoming, and any state this controller does not know (an older store's, say).
FINISHED = frozenset({"exited", "failed", "deleted"})


MAX_TEXT = 255  # characters of an id, a region, a label's key, a declared gpu_kind or arch
MAX_LABEL_VALUE = 1024
MAX_LABELS = 128
MAX_URL = 2048
MAX_TOKEN = 4096  # an HTTP header the agent's server takes whole


def validate(req: RegisterHostRequest) -> str:
    """Static checks (400 invalid_argument); returns the backend."""
    if not req.id or not req.id.strip():
        raise InvalidArgument("id is required")
    if len(req.id) > MAX_TEXT:
        raise InvalidArgument(f"id is longer than {MAX_TEXT} characters")
    if req.id in (".", ".."):
        # Free-form otherwise (clients percent-encode it, "/" included), but a
        # path segment of "." or ".." is resolved away by URL normalisation,
        # so /v1/hosts/{id} could never reach this host.
        raise InvalidArgument(f"id {req.id!r} cannot be a URL path segment; choose another id")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in req.id):
        # a newline in a path segment never matches a route (the host could be
        # registered but never fetched, cordoned or removed), and PostgreSQL
        # cannot store a NUL: no control characters, so every id stays addressable
        raise InvalidArgument(f"id {req.id!r} contains a control character; choose another id")
    if why := token_problem(req.token):
        raise InvalidArgument(f"token {why}")
    texts = [("url", req.url), ("token", req.token), ("region", req.region),
             ("capacity.gpu_kind", req.capacity.gpu_kind), ("capacity.arch", req.capacity.arch)]
    texts += [(f"labels key {k!r}", k) for k in req.labels or {}]
    texts += [(f"labels.{k}", v) for k, v in (req.labels or {}).items()]
    for field, text in texts:
        if text and "\x00" in text:  # the embedded store keeps it, PostgreSQL cannot: one rule for both
            raise InvalidArgument(f"{field} contains a NUL character")
    # Bounded, as the id is: a 5 MB label was stored and sent with every host list, and a
    # 1 MB token came back as 502 host_unreachable (the agent dropped the oversized header)
    for field, text, most in [("url", req.url, MAX_URL), ("token", req.token, MAX_TOKEN),
                              ("region", req.region, MAX_TEXT),
                              ("capacity.gpu_kind", req.capacity.gpu_kind, MAX_TEXT),
                              ("capacity.arch", req.capacity.arch, MAX_TEXT)]:
        if text and len(text) > most:
            raise InvalidArgument(f"{field} is longer than {most} characters")
    if len(req.labels or {}) > MAX_LABELS:
        raise InvalidArgument(f"labels: at most {MAX_LABELS} labels, not {len(req.labels)}")
    for k, v in (req.labels or {}).items():
        if len(k) > MAX_TEXT:
            raise InvalidArgument(f"labels: the key {k[:40]!r}... is longer than {MAX_TEXT} characters")
        if len(v) > MAX_LABEL_VALUE:
            raise InvalidArgument(f"labels.{k} is longer than {MAX_LABEL_VALUE} characters")
    if not req.url:
        raise InvalidArgument("url is required")
    parse_address(req.url)  # BadAddress (400) saying what is wrong, before the probe dials it
    backend = req.backend or "firecracker"
    if backend not in BACKENDS:
        raise InvalidArgument(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    cap = req.capacity
    if cap.vm_count <= 0:
        raise InvalidArgument("capacity.vm_count is required and must be greater than 0: "
                              "it is scheduling policy and is never probed")
    for field in (*PROBED_FIELDS, "gpus"):
        if getattr(cap, field) < 0:
            raise InvalidArgument(f"capacity.{field} must not be negative")
    if cap.gpus > 0 and backend != "qemu":
        raise InvalidArgument(f"only qemu hosts may declare capacity.gpus > 0 (backend is {backend})")
    if cap.mig_profiles:
        if backend != "qemu":
            raise InvalidArgument(f"only qemu hosts may declare capacity.mig_profiles (backend is {backend})")
        if len(cap.mig_profiles) > MAX_LABELS:  # (a GPU offers a handful; the map goes out with every host read)
            raise InvalidArgument(f"capacity.mig_profiles: at most {MAX_LABELS} profiles, not {len(cap.mig_profiles)}")
        for name, count in cap.mig_profiles.items():
            if why := mig_entry_problem(name, count):
                raise InvalidArgument(f"capacity.mig_profiles: {why}")
    return backend


def mig_entry_problem(name: str, count: int) -> str | None:
    """Why ``name: count`` cannot be an entry of a host's mig_profiles, or None. One rule
    for the declared entries (refused, 400) and the probed ones (dropped, with a warning)."""
    if why := mig_profile_problem(name):
        return f"{name!r} is not a MIG profile name in mig-parted form such as 1g.10gb or 1g.10gb+me: {why}"
    if count <= 0:
        return f"the count of {name!r} must be greater than 0, not {count}"
    if count > MAX_AMOUNT:
        return f"the count of {name!r} must be at most {MAX_AMOUNT} (2^53), not {count}"
    return None


class ProbedFacts(Record):
    """The part of an agent's GET /v1/host the registry stores. Strict types:
    a reply that does not carry these is not a fuse agent's, and nothing of
    it may reach the store. Figures are bounded as a declared one is
    (`HostCapacity`, at most 2^53): a larger one is not a machine's either."""

    cpus: StrictInt = Field(ge=0, le=MAX_AMOUNT)
    ram_mb: StrictInt = Field(ge=0, le=MAX_AMOUNT)
    storage_gb: StrictInt = Field(ge=0, le=MAX_AMOUNT)
    arch: StrictStr
    gpus: StrictInt = Field(0, ge=0, le=MAX_AMOUNT)
    gpu_kind: StrictStr = ""
    gpu_devices: list[GPUDevice] = Field(default_factory=list)
    mig_profiles: dict[str, StrictInt] = Field(default_factory=dict, max_length=MAX_LABELS)
    firecracker: StrictStr = ""
    firecracker_pinned: StrictStr = ""
    backend: StrictStr = ""
    agent_id: StrictStr = ""
    instance: StrictStr = ""  # (the agent process's own mark, new at each start; none from an older agent)
    probe_note: StrictStr = ""  # (set when its fresh probe overran: the facts are an earlier probe's)
    # A vendor tool (nvidia-smi, firecracker --version) that failed or timed out, a sentence
    # each: its facts are an earlier probe's, or none, and not what the machine has
    probe_warnings: list[StrictStr] = Field(default_factory=list)


def agent_facts(url: str, body: bytes) -> dict[str, Any]:
    """The probe's facts from a 200 reply, or NotAnAgent saying why not."""
    import json
    try:
        data = json.loads(body)
    except ValueError:
        raise NotAnAgent(f"{url} answered but is not a fuse agent: its reply to GET /v1/host is not JSON") from None
    if not isinstance(data, dict):
        raise NotAnAgent(f"{url} answered but is not a fuse agent: its reply to GET /v1/host is not a JSON object")
    try:
        return ProbedFacts.model_validate(data).model_dump(mode="json")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise NotAnAgent(f"{url} answered but is not a fuse agent: its reply to GET /v1/host has no valid "
                         f"{where} ({first['msg'][:1].lower() + first['msg'][1:]})") from None


# A proxy in front of the agent, or the agent itself, saying it cannot answer
# for now: an outage, not a wrong address.
UNAVAILABLE = (502, 503, 504)


def _said(resp) -> str:
    """A JSON error body's message, briefly and on one line, as
    ' ("...")'; nothing for any other body (an HTML page is never quoted)."""
    try:
        data = resp.json()
    except (ValueError, RecursionError):
        return ""
    err = data.get("error") if isinstance(data, dict) else None
    msg = err.get("message") if isinstance(err, dict) else data.get("detail") if isinstance(data, dict) else None
    if not isinstance(msg, str) or not msg.strip():
        return ""
    msg = " ".join(msg.split())
    return f' ("{msg[:80]}...")' if len(msg) > 80 else f' ("{msg}")'


async def probe_host(url: str, token: str | None, tls: TlsSettings | None) -> dict[str, Any]:
    """GET /v1/host on the agent. Unreachable, or answering 502/503/504:
    HostUnreachable; token refused: 502 `unauthorized` (the controller's
    request was fine; the agent behind it said no); any other answer without
    the probe's facts (another status, or a 200 that is not them): NotAnAgent."""
    # diagnose: what listens at an address that does not answer is looked at, so one speaking
    # the wrong protocol (an sshd at an http:// address) is NotAnAgent, a mistake, not an outage
    conn = HostConnection(url, token, tls, diagnose=True)
    try:
        # probed afresh (a Firecracker upgraded, CPUs pinned since the agent started: its cached
        # facts were stored); an agent from before ``fresh`` refuses it as unknown: asked plainly
        resp = await conn.request("GET", "/v1/host", params={"fresh": "true"}, max_bytes=MAX_FACTS_BYTES)
        if resp.status_code == 400 and b"fresh" in resp.content:
            resp = await conn.request("GET", "/v1/host", max_bytes=MAX_FACTS_BYTES)
    finally:
        await conn.close()
    if resp.status_code == 401:
        raise HostUnreachable(f"the host agent at {url} rejected the token" if token else
                              f"the host agent at {url} requires a token (none was given)", code="unauthorized")
    if resp.status_code in UNAVAILABLE:
        raise HostUnreachable(f"the host agent at {url} answered HTTP {resp.status_code}{_said(resp)}")
    if resp.status_code != 200:
        raise NotAnAgent(f"{url} answered but is not a fuse agent: its reply to GET /v1/host is HTTP "
                         f"{resp.status_code}{_said(resp)}, not an agent's facts")
    return agent_facts(url, resp.content)


# How long a registration waits on another address of the agent it probed
# (`HostRegistry.refuse_copied_identity`): the poller's bound, as such an address not
# answering is a machine that moved, not a copy.
OTHER_ADDRESS_S = 5.0


async def identity_at(url: str, token: str | None, tls: TlsSettings | None) -> tuple[str, str] | None:
    """(agent_id, instance) of the agent answering at ``url`` now (its facts as they are, not
    probed afresh), or None when none answers there as an agent."""
    try:
        conn = HostConnection(url, token, tls, timeout=OTHER_ADDRESS_S)
    except (HostUnreachable, InvalidArgument):  # (a mutual-TLS address and no certificate; a stored typo)
        return None
    try:
        resp = await conn.request("GET", "/v1/host", max_bytes=MAX_FACTS_BYTES)
    except HostUnreachable:
        return None
    finally:
        await conn.close()
    try:
        data = resp.json() if resp.status_code == 200 else None
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(ident := data.get("agent_id"), str):
        return None
    return ident, data["instance"] if isinstance(data.get("instance"), str) else ""


# The GPU inventory a host holds: what its agent reports, never declared (the Fuse
# orchestrator's records carry them; a declared list is ignored, with a warning).
INVENTORY = ("gpu_devices", "mig_instances", "mig_instance_uuids")


# The facts a host re-registered on declared capacity keeps from its agent's last report when
# left undeclared (README). What the agent said of them is stored beside the capacity, under
# REPORTED_KEY (no field of HostCapacity: reads of the row ignore it), since the capacity alone
# does not tell a reported value from a declared one, which a re-registration replaces.
REPORTED = ("arch", "gpus", "gpu_kind", "mig_profiles")
REPORTED_KEY = "reported"


def merge_capacity(cap: HostCapacity, backend: str, probed: dict | None, warnings: list[str],
                   before: dict | None = None, reported: dict | None = None) -> HostCapacity:
    """The capacity to store: ``cap`` as declared, with the probe's facts where they are the
    agent's to say. ``before``: the capacity stored for this host at this url and backend,
    whose agent-reported facts stand when the probe is skipped (an update, not a reset).
    ``reported``, when given, is filled with what the agent reported of REPORTED, to be stored
    as the capacity's REPORTED_KEY."""
    if reported is None:
        reported = {}
    out = cap.model_copy(deep=True)
    out.mig_instances, out.mig_instance_uuids = [], []
    # GPUs pass through on qemu hosts only: as registered, and as the agent runs (when it says)
    runs = (probed or {}).get("backend")
    passes_gpus = backend == "qemu" and (runs not in BACKENDS or runs == "qemu")
    probed_devices = (probed or {}).get("gpu_devices", []) if passes_gpus else []
    out.gpu_devices = [GPUDevice.model_validate(d) for d in probed_devices]
    for field in INVENTORY:
        if getattr(cap, field) and getattr(cap, field) != getattr(out, field):
            warnings.append(f"capacity.{field}: the GPU inventory is what the host agent reports, never "
                            f"declared; the declared value is ignored"
                            + ("" if backend == "qemu" else f" (a {backend} host passes no GPU through)"))
    if probed is None:
        out.firecracker = out.firecracker_pinned = ""
        if before:
            kept = HostCapacity.model_validate(before)
            # only what the agent reported stands: a value declared before and not now is
            # replaced, as the rest of the capacity is (a row stored before the report was
            # kept beside it has its capacity read as reported, as it was then)
            said = before.get(REPORTED_KEY)
            said = HostCapacity.model_validate(said if isinstance(said, dict) else before)
            reported.update({f: getattr(said, f) for f in REPORTED})
            out.arch = out.arch or said.arch
            if backend == "qemu":
                out.gpu_devices = kept.gpu_devices
                out.gpus = out.gpus or said.gpus
                out.gpu_kind = out.gpu_kind or said.gpu_kind
                out.mig_profiles = out.mig_profiles or said.mig_profiles
            else:
                out.firecracker, out.firecracker_pinned = kept.firecracker, kept.firecracker_pinned
        return out
    for field in PROBED_FIELDS:
        declared, real = getattr(cap, field), int(probed.get(field, 0))
        if declared == 0:
            setattr(out, field, real)
            if real == 0:  # stored as probed, but 0 is also "probe me": said out loud
                warnings.append(f"capacity.{field}: the host agent probed 0{ZERO_WHY.get(field, '')}; "
                                "stored as 0 (declare a value to override the probe)")
        else:
            _warn_above_probe(f"capacity.{field}", declared, real, warnings)
    if cap.arch and probed.get("arch") and cap.arch != probed["arch"]:
        # (replaced without a word, where every other fact that differs from the probe is said)
        warnings.append(f"capacity.arch: declared {cap.arch!r} differs from probed {probed['arch']!r}; "
                        "storing the probed value (the agent's machine is what runs the VMs)")
    out.arch = probed.get("arch", "") or out.arch
    reported["arch"] = probed.get("arch", "") or ""
    if out.arch and out.arch not in ARCHES:
        warnings.append(f"arch: the host agent runs on {out.arch}; the elastic planner plans amd64 and arm64 "
                        "machines only, so its plans leave this host out")
    # Only qemu hosts pass GPUs through (validate): on a firecracker host the
    # machine's GPUs are nobody's capacity, so the probe does not name them.
    real_kind = (probed.get("gpu_kind", "") or "") if passes_gpus else ""
    if not cap.gpu_kind:
        out.gpu_kind = real_kind
    elif not _same_gpu(cap.gpu_kind, real_kind, probed_devices):
        # Quoted as the probe reports it (repr, like the declared value), so "" when it
        # found no GPU, with the reason in words beside it: the probe never says 'none'.
        machine_kind = probed.get("gpu_kind", "") or ""
        if real_kind:
            probed_as = repr(real_kind)
        elif backend == "qemu" or not machine_kind:
            probed_as = "'' (no GPU)"
        else:
            probed_as = f"'' (a {backend} host passes no GPU through; the machine's is {machine_kind!r})"
        warnings.append(f"capacity.gpu_kind: declared {cap.gpu_kind!r} differs from probed "
                        f"{probed_as}; keeping the declared value")
    if backend == "qemu":
        # (a probed entry dropped is said only when the probe's entries are taken: declared
        # mig_profiles replace them whole)
        real_gpus = int(probed.get("gpus", 0)) if passes_gpus else 0
        real_mig = _valid_mig(probed.get("mig_profiles") or {} if passes_gpus else {},
                              [] if cap.mig_profiles else warnings)
        reported.update(gpus=real_gpus, gpu_kind=real_kind, mig_profiles=real_mig or None)
        if cap.gpus == 0:
            out.gpus = real_gpus
        else:
            _warn_above_probe("capacity.gpus", cap.gpus, real_gpus, warnings)
        if not cap.mig_profiles and real_mig:
            out.mig_profiles = real_mig
        for name, count in sorted((cap.mig_profiles or {}).items()):
            _warn_above_probe(f"capacity.mig_profiles[{name!r}]", count, int(real_mig.get(name, 0)), warnings)
        out.firecracker = out.firecracker_pinned = ""
    else:
        # Declared values are ignored: these are only ever what the agent said.
        out.firecracker = probed.get("firecracker", "") or ""
        out.firecracker_pinned = probed.get("firecracker_pinned", "") or ""
    # (unless the backend was taken from the probe, whose warning says it already)
    if probed.get("backend") and probed["backend"] != backend and not any(w.startswith("backend:") for w in warnings):
        warnings.append(f"backend: registered as {backend} but the host agent runs {probed['backend']}")
    return out


def _same_gpu(declared: str, label: str, devices: list[dict]) -> bool:
    """Does a declared gpu_kind name a GPU the probe found? The probe's label
    ("nvidia:A100"), its model alone ("A100") or a device's name as nvidia-smi prints
    it ("NVIDIA A100-SXM4-80GB") all do, in any case, for any of the machine's GPUs:
    only a GPU it does not have disagrees."""
    if not label:
        return False
    from ..agent.probe import gpu_kind_label

    want = declared.strip().casefold()
    # (each device's own label too: a machine with two kinds is labelled by its first, and
    # declaring its other one was a "differs from probed" warning)
    labels = {label, *(gpu_kind_label(d["model"]) for d in devices if d.get("model"))}
    names = {*labels, *(lb.split(":", 1)[-1] for lb in labels), *(d.get("model", "") for d in devices)}
    return want in {n.casefold() for n in names if n}


ZERO_WHY = {"storage_gb": " (less than 1 GiB free where the agent keeps its VMs)"}


def _valid_mig(probed: dict[str, int], warnings: list[str]) -> dict[str, int]:
    """The probe's mig_profiles entries that a declared one could be; each other is
    dropped with a warning (the host's other facts stand: one bad entry is not a
    wrong address)."""
    out = {}
    for name, count in sorted(probed.items()):
        if why := mig_entry_problem(name, count):
            warnings.append(f"mig_profiles: dropped the probed entry {name!r}: {count} ({why})")
        else:
            out[name] = count
    return out


def _warn_above_probe(field: str, declared: int, real: int, warnings: list[str]) -> None:
    """A declared value above the probe is an operator's overcommit: kept,
    never refused, but said out loud."""
    if declared > real:
        warnings.append(f"{field}: declared {declared} exceeds probed {real}; keeping the declared value")


class HostRegistry:
    def __init__(self, store: Store, tls=lambda: None, live=lambda host_id: {},
                 placing=lambda host_id: Resources(), placing_names=lambda host_id: []):
        self.store = store
        self._tls = tls        # () -> TlsSettings | None, the controller's current identity
        self._live = live      # host id -> poller's live figures
        # host id -> what creates (and wakes) reserved there while they wait on the host's
        # answer, and creates it did not answer until it says (VmService.placing_on). In
        # memory, read in the event loop with no await between the check and the store write,
        # so a deregister and a create's reservation never interleave (one replica's creates:
        # the ledger is per process).
        self.placing = placing
        self.placing_names = placing_names  # host id -> the names of those VMs (VmService.placing_names)

    async def register(self, req: RegisterHostRequest, backend_from_probe: bool = False,
                       then: Callable[[str], Awaitable[None]] | None = None) -> tuple[Host, bool]:
        """``backend_from_probe``: a request that names no backend takes the one the agent
        runs (seed 004's ``{name, addr}``, which has no backend field) instead of seed 000's
        default, firecracker; when the probe cannot say, see `_backend_from_probe`.

        The reply is the host as this call wrote it, with its warnings: not read back from
        the store, where a registration of the same id running beside it may have written
        its own since. Its allocated and live figures are those after ``then`` (awaited with
        the id once the row is stored: the controller polls the host there)."""
        # (the agent's own backend is known after the probe: check against qemu's rules first,
        # the most permissive, then against the backend it runs)
        from_probe = backend_from_probe and not req.backend
        backend = validate(req.model_copy(update={"backend": "qemu"}) if from_probe else req)
        # One agent, one spelling: `http://h:1/` and `http://h:1` are the same address (a
        # re-registration is not a move) and the stored form is the one compared.
        req = req.model_copy(update={"url": normalise_address(req.url)})
        warnings: list[str] = []
        try:
            probed = await probe_host(req.url, req.token, self._tls())
        except HostUnreachable as exc:
            missing = [f for f in PROBED_FIELDS if getattr(req.capacity, f) == 0]
            # A refused token, a url that is not an agent, or trust that failed (an
            # SSH host key or key, a TLS certificate) is a mistake, not an outage:
            # declared capacity does not register around it.
            mistake = exc.code == "unauthorized" or isinstance(exc, (NotAnAgent, NotTrusted))
            if mistake or missing:
                if not mistake:
                    # (named where the body takes them: in its capacity object, the short form's too)
                    hint = (f"declare {', '.join('capacity.' + f for f in missing)} explicitly to register "
                            "without a probe")
                    # one sentence: a reason that ends in a question takes the hint inside it
                    exc.message = (f"{exc.message[:-1]} (or {hint})?" if exc.message.endswith("?")
                                   else f"{exc.message}; {hint}")
                    exc.args = (exc.message,)
                raise
            probed = None
            warnings.append(f"probe skipped, host unreachable ({exc.message}); registered with the declared capacity")
        if probed:
            await self.refuse_copied_identity(req, probed)
        if probed and probed.get("probe_note"):
            warnings.append(f"the host agent at {req.url}: {probed['probe_note']}")
        warnings += [f"the host agent at {req.url}: {w}" for w in (probed or {}).get("probe_warnings", [])]
        if from_probe:
            backend = validate(req.model_copy(update={"backend": self._backend_from_probe(req.id, probed,
                                                                                          warnings)}))
        runs = (probed or {}).get("backend")
        if runs in BACKENDS and runs != "qemu" and (req.capacity.gpus > 0 or req.capacity.mig_profiles):
            # (the rule is the machine's: a host registered as qemu whose agent runs firecracker
            # passes no GPU through all the same)
            field = "capacity.gpus > 0" if req.capacity.gpus > 0 else "capacity.mig_profiles"
            raise InvalidArgument(f"only qemu hosts may declare {field}: the host agent at {req.url} runs {runs}")
        stored = self.store.get_host(req.id) if probed is None else None
        # (the probe skipped: what this host's agent reported when it last answered stands,
        # where it is the same agent, at the same url, run the same way)
        before = (stored["capacity"] if stored and _same_address(stored["url"]) == req.url
                  and stored["backend"] == backend else None)
        reported: dict[str, Any] = {}
        cap = merge_capacity(req.capacity, backend, probed, warnings, before, reported)
        now = time.time()
        with self.store.tx() as conn:
            old = self.store.get_host(req.id, conn)
            # (the same agent reached another way, its identity the probe's: a transport changed,
            # not a machine, so nothing of it is stranded)
            same_agent = bool(probed and old and old.get("agent_id") and probed.get("agent_id") == old["agent_id"])
            if old and _same_address(old["url"]) != req.url and not same_agent:
                # (a finished VM does not hold it, as for deregister: module docstring)
                if why := self._holds(conn, req.id):
                    raise Conflict(f"host {req.id} {why}; it cannot move to {req.url}")
                if why := _move_holds(conn, req.id):  # (its clean-up would reach the new url's agent)
                    raise Conflict(f"host {req.id} {why}; it cannot move to {req.url}", code="move_in_progress")
            row = dict(id=req.id, url=req.url, token=req.token or "", region=req.region or "",
                       backend=backend, labels=req.labels or {},
                       capacity=cap.model_dump(mode="json") | {REPORTED_KEY: reported},
                       state=old["state"] if old else "active",
                       # (an identity is the agent's at an address: one at another url that was not
                       # probed, or answered without one, is not the machine the old url reached)
                       agent_id=(probed or {}).get("agent_id", "") or (
                           old["agent_id"] if old and _same_address(old["url"]) == req.url else ""),
                       last_seen=now, created_at=old["created_at"] if old else now, updated_at=now)
            # The record as every read will make it, made before anything is stored: a row
            # that does not make one would fail each GET /v1/hosts until it was deleted.
            self._to_host(row, {})
            self.store.put_host(conn, row)
            self.store.add_event("host_added", {"id": req.id, "url": req.url, "reregistered": bool(old)},
                                 host=req.id, conn=conn)
        if then is not None:
            await then(req.id)
        others = [r for r in self.store.list_hosts() if r["id"] != req.id]
        host = self._to_host(row, self.store.allocated(), machine_names([*others, row])[req.id])
        host.warnings = warnings
        return host, old is None

    async def refuse_copied_identity(self, req: RegisterHostRequest, probed: dict[str, Any]) -> None:
        """409 conflict when the agent probed at ``req.url`` has the identity of an agent
        registered at another address (another host's, or this host's before) and an agent of
        that identity answers there now as another process: two machines, one agent-id file
        copied (a machine made from another's image). Taken for one machine reached two ways,
        the copy was an alias of the first, and a host moved to it forgot the VMs running on
        the first. An address that does not answer is a machine that moved (the identity goes
        with it), and an agent that reports no ``instance`` (one from before) is taken at its
        word, as before."""
        ident, instance = probed.get("agent_id") or "", probed.get("instance") or ""
        if not ident or not instance:
            return
        others: dict[str, tuple[str, str]] = {}  # address -> (the first host there, its token)
        for r in sorted(self.store.list_hosts(), key=lambda r: r["id"]):
            if r["agent_id"] == ident and (url := _same_address(r["url"])) != req.url:
                others.setdefault(url, (r["id"], r["token"]))
        if not others:
            return
        tls = self._tls()
        answers = await asyncio.gather(*(identity_at(url, token, tls) for url, (_, token) in others.items()))
        for (url, (host_id, _)), got in zip(others.items(), answers):
            if got is None or got[0] != ident or not got[1] or got[1] == instance:
                continue
            # (the agent restarted between the two reads: the address probed now answers as
            # the other does, one process, one machine)
            if (again := await identity_at(req.url, req.token, tls)) is not None and again[1] == got[1]:
                continue
            whose = "this host's address before" if host_id == req.id else f"host {host_id}'s address"
            raise Conflict(f"the host agent at {req.url} has the identity (agent_id {ident}) of the one at {url} "
                           f"({whose}), and another agent with it answers there: they are two machines, the "
                           "agent-id file of one copied from the other (a machine made from another's image?). Give "
                           "the copy an identity of its own: stop its agent, remove agent-id from its state dir (with "
                           "events.jsonl, events.jsonl.next and vms/ if it has them: they are the other machine's), "
                           "start it again and register it again")

    def _backend_from_probe(self, host_id: str, probed: dict | None, warnings: list[str]) -> str:
        """The backend of a request that names none: the one the agent runs. Not known
        (the agent was not probed, or did not say), a host registered before keeps its
        stored one, and a new one is recorded as seed 000's default, firecracker; either
        way with a warning, never silently: the store has no "unknown" backend, and
        nothing here fills it in at a later poll."""
        probed_backend = (probed or {}).get("backend")
        if probed_backend in BACKENDS:
            return probed_backend
        why = ("the host agent was not probed" if probed is None
               else "the host agent did not say which it runs" if not probed_backend
               else f"the host agent runs {probed_backend}, which is not one the registry records "
                    f"({', '.join(sorted(BACKENDS))})")
        old = self.store.get_host(host_id)
        if old and old["backend"] in BACKENDS:
            warnings.append(f"backend: none given and {why}; kept {old['backend']}, as registered before")
            return old["backend"]
        warnings.append(f"backend: none given and {why}; registered as firecracker (the default), unchecked: "
                        "register again with the backend named if the host runs qemu")
        return "firecracker"

    def _to_host(self, row: dict, alloc: dict[str, dict[str, int]], names: list[str] | None = None) -> Host:
        a = alloc.get(row["id"], {})
        cap = HostCapacity.model_validate(row["capacity"])
        live = dict(self._live(row["id"]))
        # Free room as placement believes it: what the agent reports, within what the
        # declared capacity leaves once the controller's allocations are counted, on every
        # name of the machine (``names``: one agent registered under several ids is one room).
        held = {k: sum(alloc.get(h, {}).get(k, 0) for h in (names or [row["id"]]))
                for k in ("ram_mb", "cpus", "vm_count")}
        if "free_mem_mib" in live:
            live["free_mem_mib"] = max(0, min(live["free_mem_mib"], cap.ram_mb - held["ram_mb"]))
        if "free_vcpus" in live:
            live["free_vcpus"] = max(0, min(live["free_vcpus"], cap.cpus - held["cpus"]))
        # VM slots as placement counts them (``VmService._fleet``): the policy and the agent's
        # own --max-vms, less the VMs the machine holds (the agent's count or the controller's);
        # below 0 when it holds more than that (a policy or --max-vms lowered since): deleting
        # one VM there does not make room
        running, agent_max = max(live.pop("vm_count", 0), held["vm_count"]), live.pop("max_vms", None)
        limit = min(cap.vm_count, agent_max) if isinstance(agent_max, int) else cap.vm_count
        live["free_vm_slots"] = limit - running
        return Host(
            id=row["id"], url=row["url"], region=row["region"], state=row["state"], backend=row["backend"],
            labels=row["labels"] or {}, capacity=cap,
            allocated=HostCapacity(cpus=a.get("cpus", 0), ram_mb=a.get("ram_mb", 0), vm_count=a.get("vm_count", 0)),
            last_seen=row["last_seen"], created_at=row["created_at"], updated_at=row["updated_at"],
            agent_id=row["agent_id"], **live)

    def get(self, host_id: str) -> Host:
        row = self.store.get_host(host_id)
        if row is None:
            raise NotFound(f"host {host_id} not found")
        rows = self.store.list_hosts() if row["agent_id"] else [row]
        return self._to_host(row, self.store.allocated(), machine_names(rows).get(host_id))

    def list(self) -> list[Host]:
        """Every host, by id in Python's (code point) order: the store's ORDER
        BY follows the database's collation, which on PostgreSQL may not be
        the order the list cursor compares ids in."""
        alloc = self.store.allocated()
        rows = sorted(self.store.list_hosts(), key=lambda r: r["id"])
        names = machine_names(rows)
        return [self._to_host(r, alloc, names[r["id"]]) for r in rows]

    def set_state(self, host_id: str, state: str) -> bool:
        """Put the host in ``state`` (``HostState``), with its event (``host_cordoned``,
        ``host_draining``, ``host_uncordoned``) only when that changed it: a cordon of a
        cordoned host changed nothing, and its event told an event follower it had (review
        38). False when it was so already; 404 for no such host. The row and the event are
        one write: another replica's same call in between finds the state already set."""
        from sqlalchemy import update

        from .store import hosts as hosts_t

        with self.store.tx() as conn:
            changed = conn.execute(update(hosts_t).where(hosts_t.c.id == host_id, hosts_t.c.state != state)
                                   .values(state=state, updated_at=time.time())).rowcount
            if not changed:
                if self.store.get_host(host_id, conn) is None:
                    raise NotFound(f"host {host_id} not found")
                return False
            self.store.add_event(f"host_{state}" if state != "active" else "host_uncordoned", {"id": host_id},
                                 host=host_id, conn=conn)
        return True

    def deregister(self, host_id: str, force: bool = False) -> None:
        """Remove the host: 409 while a VM that is not `FINISHED` is assigned to it (the
        message names one), while a create placed there waits on its answer, or while a
        move still needs it. Finished VMs go with it: their rows leave the store (so no
        name of theirs lingers on a host that is no more), their records stay on the agent.
        A machine still registered under another name keeps them, listed under that name
        (the first, sorted), as its poller would list them after a restart.

        ``force`` (the caller has found the agent gone): the VMs assigned go with it too,
        each with a ``vm_lost`` event, unless another name of the machine keeps them."""
        from sqlalchemy import select, update

        from .store import hosts as hosts_t, vms as vms_t

        with self.store.tx() as conn:
            row = self.store.get_host(host_id, conn)
            if row is None:
                raise NotFound(f"host {host_id} not found")
            if why := self._holds(conn, host_id, assigned=not force):
                raise Conflict(f"host {host_id} {why}")
            if why := _move_holds(conn, host_id):
                raise Conflict(f"host {host_id} {why}", code="move_in_progress")
            on = self.store.vms_on(host_id, conn)
            finished = [v["name"] for v in on if v["state"] in FINISHED]
            assigned = [v for v in on if v["state"] not in FINISHED]  # (none unless force: _holds)
            agent = row.get("agent_id") or ""
            heir = conn.execute(select(hosts_t.c.id).where(hosts_t.c.agent_id == agent, hosts_t.c.id != host_id)
                                .order_by(hosts_t.c.id).limit(1)).scalar() if agent and on else None
            if heir is not None:
                conn.execute(update(vms_t).where(vms_t.c.host == host_id).values(host=heir))
            else:
                conn.execute(vms_t.delete().where(vms_t.c.host == host_id))
                for v in assigned:
                    self.store.add_event("vm_lost", {
                        "vm": v["name"], "id": host_id, "was": v["state"],
                        "reason": f"host {host_id} was removed with force while its agent did not answer: "
                                  "the controller no longer tracks the VM (if that agent comes back, "
                                  "the VM is its own)"}, host=host_id, conn=conn)
            self.store.delete_host(conn, host_id)
            data = {"id": host_id, **({"finished_vms": finished} if finished else {}),
                    **({"finished_vms_kept_by": heir} if heir is not None and finished else {}),
                    **({"forgotten_vms": [v["name"] for v in assigned]} if assigned and heir is None else {}),
                    **({"vms_kept_by": heir} if assigned and heir is not None else {})}
            self.store.add_event("host_removed", data, host=host_id, conn=conn)

    def _holds(self, conn, host_id: str, assigned: bool = True) -> str | None:
        """Why VMs tie ``host_id`` to its machine (one assigned that is not
        `FINISHED`, or a create waiting on the host's answer, which may yet land
        one), or None: what refuses a deregister and a move to another url alike.
        (``assigned`` False: only the creates waiting count.)"""
        unfinished = [v for v in self.store.vms_on(host_id, conn) if v["state"] not in FINISHED] if assigned else []
        if unfinished:
            return f"still has vm {unfinished[0]['name']} assigned"
        placing = self.placing(host_id).count
        if placing > 0:
            names = self.placing_names(host_id)
            what = (f"vm {names[0]}" + (f" (and {placing - 1} more)" if placing > 1 else "") if names
                    else f"{placing} vm{'s' if placing > 1 else ''}")
            return (f"has {what} being placed on it (a create or wake waiting "
                    "on the host's answer); try again once it has answered")
        return None

    def token(self, host_id: str) -> str:
        row = self.store.get_host(host_id)
        return row["token"] if row else ""


def _same_address(url: str) -> str:
    """A stored url as registering it now would store it (rows from before
    urls were normalised may differ only in spelling)."""
    try:
        return normalise_address(url)
    except InvalidArgument:
        return url


def _move_holds(conn, host_id: str) -> str | None:
    """Why a move still needs ``host_id`` (a copy to wake, abort or remove
    there), or None: deregistering it then would strand that copy."""
    from sqlalchemy import or_, select

    from .moves import ACTIVE
    from .store import moves as moves_t

    rows = conn.execute(select(moves_t).where(
        or_(moves_t.c.source == host_id, moves_t.c.target == host_id))).mappings()
    for m in rows:
        rec = m["record"] or {}
        if m["state"] in ACTIVE:
            return f"is in move {m['id']} of vm {m['vm']} (still {m['state']})"
        if m["state"] == "failed" and rec.get("cleanup_pending") and m["target"] == host_id:
            return f"still holds the aborted copy of move {m['id']} (clean-up pending)"
        if m["state"] == "done" and not rec.get("source_removed") and m["source"] == host_id:
            return f"still holds the source copy of move {m['id']} (removal pending)"
    return None



def machine_names(hosts: list[dict]) -> dict[str, list[str]]:
    """Host id -> every name its machine is registered under (itself included): the
    hosts that share its agent identity, or just itself when it has none recorded."""
    by_agent: dict[str, list[str]] = {}
    for r in hosts:
        if r.get("agent_id"):
            by_agent.setdefault(r["agent_id"], []).append(r["id"])
    return {r["id"]: by_agent[r["agent_id"]] if r.get("agent_id") else [r["id"]] for r in hosts}
