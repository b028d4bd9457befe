"""What a session and a cell ask for, as frozen values, and the parsing of user input.

A `ShapeRequest` is what the magic's arguments say about the ranks (any field may be
left out); `resolve_shape` turns it into a `SessionSpec` once the node's devices are
known; `check_same_shape` compares a request with a running session.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from jupyter_dist.common.hosts import HostSpec
from jupyter_dist.common.payloads import Backend, Device, SessionRequest, SpecJSON
from jupyter_dist.errors import NoGPUError, ShapeMismatchError, SpecError

BACKENDS: tuple[Backend, ...] = ("gloo", "nccl")
REMOTE_LAUNCHERS = ("ssh", "slurm")
DEFAULT_SESSION = "default"
DEFAULT_CPU_PROCS = 2
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
    if not all(re.fullmatch(r"-?\d+", p) for p in parts):
        raise SpecError(f"{flag} {text!r}: expected a whole number, or one per node like 4,2")
    counts = tuple(int(p) for p in parts)
    for count in counts:
        check_positive(flag, count)
    return counts


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

    hosts: tuple[HostSpec, ...] = ()
    python: str | None = None
    ssh_config: str | None = None
    launcher: str | None = None  # how agents start on the hosts: "ssh" (default) or "slurm"

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
    launcher: str = "local"  # "local" (this machine), "ssh", "slurm" (srun in an allocation)

    def to_json(self) -> SpecJSON:
        return cast(SpecJSON, dataclasses.asdict(self))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SessionSpec:
        """The inverse of `to_json`; unknown keys (a newer peer's) are ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in known}
        fields["hosts"] = tuple(HostSpec(**h) for h in fields.get("hosts", ()))
        fields["node_procs"] = tuple(fields.get("node_procs", ()))
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
        pg = self.backend if self.init_process_group else "no process group"
        return f"{where} ({pg})"

    def flags(self) -> str:
        """The magic flags that would ask for this shape."""
        counts = _show(self.node_procs) or str(self.procs_per_node)
        size = f"--gpus {counts}" if self.device == "cuda" else f"--procs {counts}"
        nodes = f"--nodes {self.nodes} " if self.nodes != 1 else ""
        return f"{nodes}{size} --backend {self.backend}"


def check_positive(flag: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise SpecError(f"{flag} {value}: expected a whole number of at least 1")


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


def parse_ranks(text: str, world_size: int | None = None) -> tuple[int, ...]:
    """``"0,2-3"`` -> ``(0, 2, 3)``, checked against the world size when known."""
    ranks: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise SpecError(
                f"--ranks {text!r}: {part!r} is not a rank or a range; expected e.g. 0,2-3"
            )
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise SpecError(f"--ranks {text!r}: range {part!r} runs backwards; write {hi}-{lo}")
        ranks.update(range(lo, hi + 1))
    if world_size is not None:
        bad = sorted(r for r in ranks if r >= world_size)
        if bad:
            raise SpecError(
                f"--ranks {text!r}: rank {bad[0]} does not exist; the session has ranks "
                f"0-{world_size - 1}"
            )
    return tuple(sorted(ranks))


def validate_request(req: ShapeRequest) -> None:
    """Checks that need no knowledge of the machine."""
    check_positive("--nodes", req.nodes)
    gpus, procs = as_counts(req.gpus), as_counts(req.procs)
    for flag, counts in (("--gpus", gpus), ("--procs", procs)):
        for count in counts or ():
            check_positive(flag, count)
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
    if req.backend is not None and req.backend not in BACKENDS:
        raise SpecError(f"--backend {req.backend!r}: expected one of {', '.join(BACKENDS)}")
    if req.backend == "nccl" and procs is not None:
        raise SpecError(
            f"--backend nccl with --procs {_show(procs)}: NCCL needs GPUs; use --gpus N, or "
            "--backend gloo for CPU ranks"
        )
    if req.launcher is not None and req.launcher not in REMOTE_LAUNCHERS:
        raise SpecError(f"launcher {req.launcher!r}: expected one of {', '.join(REMOTE_LAUNCHERS)}")
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
            "--hosts a,b or --hostfile FILE"
        )


def resolve_shape(name: str, req: ShapeRequest, local_gpus: int, host: str) -> SessionSpec:
    """Turn a request into a session spec, given the node's CUDA device count."""
    validate_request(req)
    if req.hosts:
        return _resolve_remote(name, req)
    nodes = req.nodes or 1
    init = True if req.init is None else req.init
    gpus, procs = as_counts(req.gpus), as_counts(req.procs)
    for flag, counts in (("--gpus", gpus), ("--procs", procs)):
        if counts and len(counts) > 1:
            raise SpecError(
                f"{flag} {_show(counts)}: one count per node needs the nodes, --hosts a,b or "
                "--hostfile FILE; on this machine give one count"
            )
    if gpus is not None:
        if gpus[0] > local_gpus:
            raise NoGPUError(
                f"--gpus {gpus[0]}: node {host!r} has {local_gpus} CUDA device"
                f"{'s' if local_gpus != 1 else ''}; use --procs {gpus[0]} for "
                f"{gpus[0]} CPU ranks with the gloo backend"
            )
        return SessionSpec(name, nodes, gpus[0], "cuda", _backend(req, "nccl"), init)
    if procs is not None:
        return SessionSpec(name, nodes, procs[0], "cpu", _backend(req, "gloo"), init)
    if req.backend == "nccl" or (req.backend is None and local_gpus > 0):
        if local_gpus == 0:
            raise NoGPUError(
                f"--backend nccl: node {host!r} has no CUDA device; use --procs N for CPU "
                "ranks with the gloo backend"
            )
        return SessionSpec(name, nodes, local_gpus, "cuda", _backend(req, "nccl"), init)
    return SessionSpec(name, nodes, DEFAULT_CPU_PROCS, "cpu", _backend(req, "gloo"), init)


def _resolve_remote(name: str, req: ShapeRequest) -> SessionSpec:
    """Nodes over SSH: devices are checked once each node's agent reports them."""
    init = True if req.init is None else req.init
    nodes = len(req.hosts)

    def spec(counts: Counts, device: Device, backend: Backend) -> SessionSpec:
        per_node = counts * nodes if len(counts) == 1 else counts
        uneven = per_node if len(set(per_node)) > 1 else ()
        return SessionSpec(
            name, nodes, per_node[0], device, backend, init,
            hosts=req.hosts, python=req.python, ssh_config=req.ssh_config, node_procs=uneven,
            launcher=req.launcher or "ssh",
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
    if req.hosts and req.hosts != running.hosts:
        said.append("--hosts " + ",".join(str(h) for h in req.hosts))
    if said:
        raise ShapeMismatchError(
            f"session {running.name!r} is running {running.describe()}; this cell asks for "
            f"{' '.join(said)}. Run `%dist shutdown --session {running.name}` and re-run the "
            f"cell to start the new shape, or pick another session with --session NAME "
            f"(or drop the flags to use the running ranks)"
        )
