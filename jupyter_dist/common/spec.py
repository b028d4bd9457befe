"""What a session and a cell ask for, as frozen values, and the parsing of user input.

A `ShapeRequest` is what the magic's arguments say about the ranks (any field may be
left out); `resolve_shape` turns it into a `SessionSpec` once the node's devices are
known; `check_same_shape` compares a request with a running session.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from jupyter_dist.common.bounded import shown
from jupyter_dist.common.hosts import (
    MAX_NODES,
    HostSpec,
    check_node_count,
    check_python,
    whole_number,
)
from jupyter_dist.common.k8s_options import K8sSpec
from jupyter_dist.common.payloads import Backend, Device, Framework, SessionRequest, SpecJSON
from jupyter_dist.common.ray_options import RaySpec
from jupyter_dist.errors import NoGPUError, ShapeMismatchError, SpecError
from jupyter_dist.settings import MAX_RANKS_VAR, max_ranks_per_node

BACKENDS: tuple[Backend, ...] = ("gloo", "nccl")
#: what the bootstrap prepares in each rank (``--framework``); the first is the default
FRAMEWORKS: tuple[Framework, ...] = ("torch", "jax", "none")
#: launchers that start agents on listed hosts
REMOTE_LAUNCHERS = ("ssh", "slurm")
#: launchers that find their nodes themselves (a cluster manager places them)
CLUSTER_LAUNCHERS = ("ray", "k8s")
DEFAULT_SESSION = "default"
DEFAULT_CPU_PROCS = 2
#: more ranks than a session may have, whatever the nodes: ``--ranks`` is checked against it
#: before the session's own size is known
MAX_WORLD_SIZE = 65536
_SESSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


Counts = tuple[int, ...]


def as_counts(value: int | Counts | None) -> Counts | None:
    """One count for every node (``4``) or one per node (``(4, 2)``), as a tuple."""
    if value is None:
        return None
    return (value,) if isinstance(value, int) else tuple(value)


def parse_counts(flag: str, text: str) -> Counts:
    """``"4"`` -> ``(4,)``; ``"4,2"`` -> ``(4, 2)``: ranks per node."""
    parts = [p.strip() for p in text.split(",")]
    check_node_count(len(parts), flag)
    counts = []
    for part in parts:
        m = re.fullmatch(r"(-?)([0-9]+)", part)
        if m is None:
            raise SpecError(
                f"{flag} {text[:80]!r}: expected a whole number, or one per node like 4,2"
            )
        count = whole_number(m.group(2))
        if count is None:
            raise SpecError(f"{flag} {part[:20]}...: more ranks than any node runs")
        counts.append(-count if m.group(1) else count)
    for count in counts:
        check_positive(flag, count)
    return tuple(counts)


def _show(counts: Counts) -> str:
    return ",".join(map(str, counts))


@dataclass(frozen=True)
class ShapeRequest:
    """The shape a cell asks for; ``None`` means "not said"."""

    nodes: int | None = None
    gpus: int | Counts | None = None  # ranks per node: one count, or one per node
    procs: int | Counts | None = None
    backend: str | None = None
    init: bool | None = None
    framework: str | None = None  # one of `FRAMEWORKS`

    hosts: tuple[HostSpec, ...] = ()
    python: str | None = None
    ssh_config: str | None = None
    launcher: str | None = None  # "ssh" (default with hosts), "slurm", "ray" or "k8s" (no hosts)
    ray: RaySpec | None = None  # with launcher "ray": how the nodes are placed
    k8s: K8sSpec | None = None  # with launcher "k8s": the nodes' pods

    def to_json(self) -> SessionRequest:
        """The request as the server's ``POST /sessions`` takes it (unsaid fields left out)."""
        data: dict[str, Any] = {
            k: v for k, v in dataclasses.asdict(self).items() if v not in (None, ())
        }
        for key in ("gpus", "procs"):
            if isinstance(data.get(key), tuple):
                data[key] = list(data[key])
        if self.hosts:
            data["hosts"] = [
                {k: v for k, v in dataclasses.asdict(h).items() if v is not None}
                for h in self.hosts
            ]
        return cast(SessionRequest, data)


@dataclass(frozen=True)
class SessionSpec:
    """The resolved shape of a session: how many ranks, where, on what devices."""

    name: str = DEFAULT_SESSION
    nodes: int = 1
    procs_per_node: int = DEFAULT_CPU_PROCS
    device: Device = "cpu"
    backend: Backend = "gloo"
    init_process_group: bool = True
    hosts: tuple[HostSpec, ...] = ()  # empty: this machine, no SSH
    python: str | None = None  # the nodes' interpreter (default: the notebook's, else python3)
    ssh_config: str | None = None  # default: ~/.ssh/config
    node_procs: Counts = ()  # ranks on each node when they differ; empty: procs_per_node
    #: "local" (this machine), "ssh", "slurm" (srun in an allocation), "ray" (actors),
    #: "k8s" (pods of a Kubernetes Job)
    launcher: str = "local"
    #: "torch": the process group is made (unless ``--no-init``); "jax": every rank gets
    #: what ``jax.distributed.initialize()`` needs; "none": nothing is initialised
    framework: Framework = "torch"
    ray: RaySpec | None = None  # launcher "ray": the placement on the cluster
    k8s: K8sSpec | None = None  # launcher "k8s": the pods on the cluster

    def to_json(self) -> SpecJSON:
        return cast(SpecJSON, dataclasses.asdict(self))

    @property
    def remote(self) -> bool:
        """Whether the nodes are other machines (listed hosts, or placed by a cluster
        manager), not this one."""
        return bool(self.hosts) or self.launcher in CLUSTER_LAUNCHERS

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SessionSpec:
        """The inverse of `to_json`; unknown keys (a newer peer's) are ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in known}
        fields["hosts"] = tuple(HostSpec(**h) for h in fields.get("hosts", ()))
        fields["node_procs"] = tuple(fields.get("node_procs", ()))
        if fields.get("ray") is not None:
            fields["ray"] = RaySpec.from_json(fields["ray"])
        if fields.get("k8s") is not None:
            fields["k8s"] = K8sSpec.from_json(fields["k8s"])
        return cls(**fields)

    def procs_on(self, node: int) -> int:
        """Ranks on node ``node``."""
        return self.node_procs[node] if self.node_procs else self.procs_per_node

    @property
    def counts(self) -> Counts:
        return tuple(self.procs_on(n) for n in range(self.nodes))

    @property
    def world_size(self) -> int:
        return sum(self.counts)

    def describe(self) -> str:
        """``"2 CPU ranks (gloo)"`` / ``"2 nodes x 4 GPUs (nccl)"`` / ``"2 nodes x 4,2 GPUs"``."""
        unit = "GPU" if self.device == "cuda" else "CPU rank"
        many = self.node_procs or self.procs_per_node != 1
        per = f"{_show(self.node_procs) or self.procs_per_node} {unit}{'s' if many else ''}"
        where = f"{self.nodes} nodes x {per}" if self.nodes > 1 else per
        if self.framework == "jax":
            pg = "jax"
        else:
            pg = self.backend if self.init_process_group else "no process group"
        return f"{where} ({pg})"

    def flags(self) -> str:
        """The magic flags that would ask for this shape."""
        counts = _show(self.node_procs) or str(self.procs_per_node)
        size = f"--gpus {counts}" if self.device == "cuda" else f"--procs {counts}"
        nodes = f"--nodes {self.nodes} " if self.nodes != 1 else ""
        framework = f" --framework {self.framework}" if self.framework != "torch" else ""
        return f"{nodes}{size} --backend {self.backend}{framework}"


def check_positive(flag: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise SpecError(f"{flag} {shown(value)}: expected a whole number of at least 1")


def check_session_name(name: str) -> str:
    if not _SESSION_NAME.match(name):
        raise SpecError(
            f"--session {name!r}: expected 1-64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name


def parse_names(text: str, flag: str = "--push") -> list[str]:
    """``"a,b c"`` -> ``["a", "b", "c"]``; each must be a Python identifier."""
    names = [n for n in re.split(r"[,\s]+", text.strip()) if n]
    if not names:
        raise SpecError(f"{flag} {text!r}: expected one or more variable names, like a,b")
    for name in names:
        if not _IDENTIFIER.match(name):
            raise SpecError(f"{flag}: {name!r} is not a Python variable name")
    return names


def parse_framework(text: str) -> Framework:
    """``--framework``: one of `FRAMEWORKS` (case and surrounding blanks do not matter)."""
    wanted = text.strip().lower()
    for framework in FRAMEWORKS:
        if framework == wanted:
            return framework
    shown = text if len(text) <= 40 else text[:37] + "..."
    raise SpecError(
        f"--framework {shown!r}: expected one of {', '.join(FRAMEWORKS)} (torch: the "
        "torch.distributed process group; jax: what jax.distributed.initialize() needs; "
        "none: nothing initialised)"
    )


def check_seconds(flag: str, value: float | None) -> float | None:
    """A finite positive number of seconds (``nan`` and ``inf`` are floats too)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise SpecError(f"{flag} {value}: expected a finite positive number of seconds")
    return value


def parse_ranks(text: str, world_size: int | None = None) -> tuple[int, ...]:
    """``"0,2-3"`` -> ``(0, 2, 3)``, checked against the world size when known (else
    against `MAX_WORLD_SIZE`) before any range is expanded."""
    limit = MAX_WORLD_SIZE if world_size is None else min(world_size, MAX_WORLD_SIZE)
    shown = text if len(text) <= 80 else text[:77] + "..."

    def rank(raw: str) -> int:
        value = whole_number(raw)
        if value is None or value >= limit:
            has = (
                f"the session has ranks 0-{world_size - 1}"
                if world_size is not None
                else f"a session has at most {MAX_WORLD_SIZE} ranks"
            )
            raise SpecError(f"--ranks {shown!r}: rank {raw[:20]} does not exist; {has}")
        return value

    spans: list[tuple[int, int]] = []
    for part in (p.strip() for p in text.split(",")):
        m = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", part)
        if m is None:
            raise SpecError(
                f"--ranks {shown!r}: {part[:40]!r} is not a rank or a range; expected e.g. 0,2-3"
            )
        lo = rank(m.group(1))
        hi = lo if m.group(2) is None else rank(m.group(2))
        if hi < lo:
            raise SpecError(f"--ranks {shown!r}: range {part!r} runs backwards; write {hi}-{lo}")
        spans.append((lo, hi))
    # merged before they are expanded: "0-9,0-9,..." costs no more than "0-9"
    ranks: list[int] = []
    for lo, hi in sorted(spans):
        start = max(lo, ranks[-1] + 1) if ranks else lo
        ranks.extend(range(start, hi + 1))
    return tuple(ranks)


def validate_request(req: ShapeRequest) -> None:
    """Checks that need no knowledge of the machine."""
    check_positive("--nodes", req.nodes)
    if req.nodes is not None and req.nodes > MAX_NODES:
        raise SpecError(f"--nodes {shown(req.nodes)}: a session takes at most {MAX_NODES} nodes")
    check_node_count(len(req.hosts), "hosts")
    if req.python is not None:
        check_python(req.python)
    gpus, procs = as_counts(req.gpus), as_counts(req.procs)
    for flag, counts in (("--gpus", gpus), ("--procs", procs)):
        if counts is not None:
            check_node_count(len(counts), flag)
        for count in counts or ():
            check_positive(flag, count)
            if count > MAX_WORLD_SIZE:
                raise SpecError(
                    f"{flag} {shown(count)}: a session has at most {MAX_WORLD_SIZE} ranks in all"
                )
        if req.hosts and counts and len(counts) > 1 and len(counts) != len(req.hosts):
            raise SpecError(
                f"{flag} {_show(counts)}: {len(counts)} counts for {len(req.hosts)} "
                "node(s); give one count for every node, or one per node"
            )
    if gpus is not None and procs is not None:
        raise SpecError(
            f"--gpus {_show(gpus)} and --procs {_show(procs)}: give one; --gpus starts one rank "
            "per CUDA device, --procs starts CPU ranks"
        )
    if req.framework is not None:
        parse_framework(req.framework)  # raises, naming the value and the choices
    if req.backend is not None and req.backend not in BACKENDS:
        raise SpecError(f"--backend {req.backend!r}: expected one of {', '.join(BACKENDS)}")
    if req.backend == "nccl" and procs is not None:
        raise SpecError(
            f"--backend nccl with --procs {_show(procs)}: NCCL needs GPUs; use --gpus N, or "
            "--backend gloo for CPU ranks"
        )
    launchers = (*REMOTE_LAUNCHERS, *CLUSTER_LAUNCHERS)
    if req.launcher is not None and req.launcher not in launchers:
        raise SpecError(f"launcher {req.launcher!r}: expected one of {', '.join(launchers)}")
    if req.launcher in CLUSTER_LAUNCHERS:
        _validate_cluster(req, gpus, procs)
        return
    if req.ray is not None:
        raise SpecError("ray options without --ray: add --ray to place the nodes on a Ray cluster")
    if req.k8s is not None:
        raise SpecError("k8s options without --k8s: add --k8s to run the nodes as Kubernetes pods")
    if req.launcher is not None and not req.hosts:
        raise SpecError(f"launcher {req.launcher!r}: no hosts to start agents on")
    if req.hosts and req.nodes is not None and req.nodes != len(req.hosts):
        names = ",".join(str(h) for h in req.hosts)
        raise SpecError(
            f"--nodes {req.nodes} but {len(req.hosts)} hosts are given ({names}); drop --nodes "
            f"(it defaults to the number of hosts) or list {req.nodes} hosts"
        )
    if not req.hosts and req.nodes is not None and req.nodes > 1:
        raise SpecError(
            f"--nodes {req.nodes}: more than one node needs to know where they are; give "
            "--hosts a,b or --hostfile FILE, --ray to place them on a Ray cluster, or --k8s "
            "to run them as Kubernetes pods"
        )


def _validate_cluster(req: ShapeRequest, gpus: Counts | None, procs: Counts | None) -> None:
    """A cluster manager places the nodes: no hosts, and each node's ranks said."""
    flag = f"--{req.launcher}"
    if req.hosts:
        raise SpecError(
            f"{flag} and --hosts/--hostfile: give one; {flag} places the nodes on the cluster"
        )
    if gpus is None and procs is None:
        raise SpecError(
            f"{flag}: say how many ranks each node runs: --gpus G (one per GPU the node's "
            "bundle holds) or --procs P (CPU ranks), one count or one per node"
        )
    if req.launcher != "ray" and req.ray is not None:
        raise SpecError(f"{flag} and --ray options: give one cluster manager")
    if req.launcher != "k8s" and req.k8s is not None:
        raise SpecError(f"{flag} and --k8s options: give one cluster manager")
    counts = gpus or procs or ()
    nodes = req.nodes or 1
    if len(counts) > 1 and len(counts) != nodes:
        raise SpecError(
            f"{'--gpus' if gpus else '--procs'} {_show(counts)}: {len(counts)} counts for "
            f"--nodes {nodes}; give one count for every node, or one per node"
        )


def resolve_shape(
    name: str, req: ShapeRequest, local_gpus: int, host: str, max_ranks: int | None = None
) -> SessionSpec:
    """Turn a request into a session spec, given the node's CUDA device count; refuse more
    than ``max_ranks`` ranks on a node (default: `settings.max_ranks_per_node`)."""
    validate_request(req)
    if req.launcher in CLUSTER_LAUNCHERS:
        spec = _resolve_cluster(name, req)
    elif req.hosts:
        spec = _resolve_remote(name, req)
    else:
        spec = _resolve_local(name, req, local_gpus, host)
    check_limits(spec, max_ranks_per_node() if max_ranks is None else max_ranks)
    return spec


def check_limits(spec: SessionSpec, max_ranks: int) -> None:
    """Refuse a shape larger than a node may run, before anything starts: a typo's
    ``--procs 1000`` would otherwise fork a thousand kernels."""
    for node, count in enumerate(spec.counts):
        if count > max_ranks:
            flag = "--gpus" if spec.device == "cuda" else "--procs"
            where = (
                f"node {spec.hosts[node]}"
                if spec.hosts
                else f"node {node} of the cluster"
                if spec.remote
                else "this machine"
            )
            raise SpecError(
                f"{flag} {shown(count)}: at most {max_ranks} ranks may run on a node ({where}); "
                f"set {MAX_RANKS_VAR} (or the server's DistServerApp.max_ranks_per_node) "
                "to allow more"
            )
    if spec.world_size > MAX_WORLD_SIZE:
        raise SpecError(
            f"{spec.describe()}: {spec.world_size} ranks; a session has at most {MAX_WORLD_SIZE}"
        )


def _resolve_local(name: str, req: ShapeRequest, local_gpus: int, host: str) -> SessionSpec:
    """This machine: devices are known now. ``--python`` picks the agent's interpreter
    here as on other nodes."""
    nodes = req.nodes or 1
    framework = _framework(req)
    init = req.init is not False and framework == "torch"
    gpus, procs = as_counts(req.gpus), as_counts(req.procs)
    for flag, counts in (("--gpus", gpus), ("--procs", procs)):
        if counts and len(counts) > 1:
            raise SpecError(
                f"{flag} {_show(counts)}: one count per node needs the nodes, --hosts a,b or "
                "--hostfile FILE; on this machine give one count"
            )

    def spec(per_node: int, device: Device, backend: Backend) -> SessionSpec:
        return SessionSpec(
            name, nodes, per_node, device, backend, init, framework=framework, python=req.python
        )

    if gpus is not None:
        if gpus[0] > local_gpus:
            raise NoGPUError(
                f"--gpus {gpus[0]}: node {host!r} has {local_gpus} CUDA device"
                f"{'s' if local_gpus != 1 else ''}; use --procs {gpus[0]} for "
                f"{gpus[0]} CPU ranks with the gloo backend"
            )
        return spec(gpus[0], "cuda", _backend(req, "nccl"))
    if procs is not None:
        return spec(procs[0], "cpu", _backend(req, "gloo"))
    if req.backend == "nccl" or (req.backend is None and local_gpus > 0):
        if local_gpus == 0:
            raise NoGPUError(
                f"--backend nccl: node {host!r} has no CUDA device; use --procs N for CPU "
                "ranks with the gloo backend"
            )
        return spec(local_gpus, "cuda", _backend(req, "nccl"))
    return spec(DEFAULT_CPU_PROCS, "cpu", _backend(req, "gloo"))


def _resolve_remote(name: str, req: ShapeRequest) -> SessionSpec:
    """Nodes over SSH: devices are checked once each node's agent reports them."""
    framework = _framework(req)
    init = req.init is not False and framework == "torch"
    nodes = len(req.hosts)

    def spec(counts: Counts, device: Device, backend: Backend) -> SessionSpec:
        per_node = counts * nodes if len(counts) == 1 else counts
        uneven = per_node if len(set(per_node)) > 1 else ()
        return SessionSpec(
            name, nodes, per_node[0], device, backend, init,
            hosts=req.hosts, python=req.python, ssh_config=req.ssh_config, node_procs=uneven,
            launcher=req.launcher or "ssh", framework=framework,
        )  # fmt: skip

    procs = as_counts(req.procs)
    if procs is not None:
        return spec(procs, "cpu", _backend(req, "gloo"))
    gpus = as_counts(req.gpus)
    slots = [h.slots for h in req.hosts]
    if gpus is None and all(s is not None for s in slots):
        gpus = tuple(s for s in slots if s is not None)
    if gpus is None:
        if any(s is not None for s in slots):
            missing = [str(h) for h in req.hosts if h.slots is None]
            raise SpecError(
                f"hostfile: {', '.join(missing)} give no slots=N while others do; give every "
                "host its slots, or pass --gpus G / --procs P"
            )
        raise SpecError(
            "say how many ranks each node runs: --gpus G (one per CUDA device) or --procs P "
            "(CPU ranks), one count or one per node, or slots=N in the hostfile"
        )
    return spec(gpus, "cuda", _backend(req, "nccl"))


def _resolve_cluster(name: str, req: ShapeRequest) -> SessionSpec:
    """Nodes a cluster manager places (`validate_request` checked the counts): devices are
    checked once each node's agent reports them."""
    framework = _framework(req)
    init = req.init is not False and framework == "torch"
    gpus, procs = as_counts(req.gpus), as_counts(req.procs)
    counts = gpus or procs or ()
    nodes = req.nodes or len(counts)
    per_node = counts * nodes if len(counts) == 1 else counts
    uneven = per_node if len(set(per_node)) > 1 else ()
    device: Device = "cuda" if gpus else "cpu"
    return SessionSpec(
        name, nodes, per_node[0], device, _backend(req, "nccl" if gpus else "gloo"), init,
        python=req.python, node_procs=uneven, launcher=req.launcher or "ray",
        framework=framework,
        ray=(req.ray or RaySpec()) if req.launcher in (None, "ray") else None,
        k8s=(req.k8s or K8sSpec()) if req.launcher == "k8s" else None,
    )  # fmt: skip


def _framework(req: ShapeRequest) -> Framework:
    """The framework a request names (checked by `validate_request`), else ``torch``."""
    return FRAMEWORKS[0] if req.framework is None else parse_framework(req.framework)


def _backend(req: ShapeRequest, default: Backend) -> Backend:
    """The backend a request names (`validate_request` checked it is one), else ``default``."""
    return next((b for b in BACKENDS if b == req.backend), default)


def check_same_shape(running: SessionSpec, req: ShapeRequest) -> None:
    """Raise `ShapeMismatchError` if the request contradicts the running session."""
    validate_request(req)
    said: list[str] = []
    if req.nodes is not None and req.nodes != running.nodes:
        said.append(f"--nodes {req.nodes}")
    for flag, device, value in (("--gpus", "cuda", req.gpus), ("--procs", "cpu", req.procs)):
        counts = as_counts(value)
        if counts is None:
            continue
        same = counts == running.counts or (len(counts) == 1 and set(running.counts) == {counts[0]})
        if running.device != device or not same:
            said.append(f"{flag} {_show(counts)}")
    if req.backend is not None and req.backend != running.backend:
        said.append(f"--backend {req.backend}")
    if req.init is False and running.init_process_group:
        said.append("--no-init")
    if req.framework is not None and parse_framework(req.framework) != running.framework:
        said.append(f"--framework {req.framework}")
    if req.hosts and req.hosts != running.hosts:
        said.append("--hosts " + ",".join(str(h) for h in req.hosts))
    if req.launcher is not None and req.launcher != running.launcher:
        said.append(f"--{req.launcher}")
    elif req.ray is not None and running.ray is not None and req.ray != running.ray:
        said.append("other --ray-* options")
    elif req.k8s is not None and running.k8s is not None and req.k8s != running.k8s:
        said.append("other --k8s options")
    if said:
        raise ShapeMismatchError(
            f"session {running.name!r} is running {running.describe()}; this cell asks for "
            f"{' '.join(said)}. Run `%dist shutdown --session {running.name}` and re-run the "
            f"cell to start the new shape, or pick another session with --session NAME "
            f"(or drop the flags to use the running ranks)"
        )
