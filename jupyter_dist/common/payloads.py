"""The JSON objects that cross a process or role boundary, typed in one place.

A session's status, the connection details of its rank kernels, the control plane's change
events, the agent protocol's commands and events, and the bodies of the server's REST API
are plain dicts on the wire (JSON), and several modules, in different processes, build
and read them. Spelling each one out here as a `TypedDict` lets mypy check every key a
producer writes and a consumer reads against the same definition; the closed sets among
their values (states, devices, backends) are `Literal` aliases.

Field names are part of the protocol (the REST API, ``rest-api.yaml``, the agent's JSON
lines): changing one here changes the wire. Keys marked optional are sometimes left out
(``total=False`` bases, since ``NotRequired`` needs Python 3.11). Nothing here is checked
at run time: values read off a wire are as trustworthy as the peer that wrote them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypedDict

# -- closed sets ---------------------------------------------------------------------------
#: where a session's ranks compute
Device = Literal["cpu", "cuda"]
#: torch.distributed backends a session may use
Backend = Literal["gloo", "nccl"]
#: what a rank's bootstrap prepares: a torch process group, JAX's cluster, or nothing
Framework = Literal["torch", "jax", "none"]
#: `control.rank_group.SessionState` values
SessionStateName = Literal[
    "starting", "ready", "degraded", "healing", "broken", "restarting", "stopped"
]
#: `control.rank_group.RankState` values
RankStateName = Literal["starting", "idle", "busy", "dead"]
#: how a rank kernel's sockets are addressed (TCP ports, or Unix sockets ``ip-port``)
Transport = Literal["tcp", "ipc"]


# -- values inside other payloads ----------------------------------------------------------
class GPUJSON(TypedDict):
    """`common.gpus.GPUInfo.to_json`."""

    index: int
    name: str
    memory_total_mib: int
    uuid: str


class _HostOptions(TypedDict, total=False):
    user: str | None
    port: int | None
    slots: int | None
    python: str | None


class HostJSON(_HostOptions):
    """A `common.hosts.HostSpec` (unset fields may be left out)."""

    name: str


class RaySpecJSON(TypedDict):
    """`common.ray_options.RaySpec.to_json`: a session's placement on a Ray cluster."""

    address: str | None
    strategy: str
    runtime_env: str
    cpus: int
    gpus: int | None
    timeout: float | None
    resources: str


class K8sSpecJSON(TypedDict):
    """`common.k8s_options.K8sSpec.to_json`: a session's pods on a Kubernetes cluster."""

    namespace: str | None
    context: str | None
    image: str | None
    cpus: str | None
    memory: str | None
    node_selector: list[str]
    tolerations: list[str]
    pod_template: str | None
    callback: str | None
    timeout: float | None
    deadline: int
    grace: float
    queue: str | None
    queue_timeout: float
    gang_timeout: float
    priority_class: str | None
    scheduler: str | None
    gpu_resource: str


class SpecJSON(TypedDict):
    """`common.spec.SessionSpec.to_json` (sequences are tuples before they are JSON)."""

    name: str
    nodes: int
    procs_per_node: int
    device: Device
    backend: Backend
    init_process_group: bool
    hosts: Sequence[HostJSON]
    python: str | None
    ssh_config: str | None
    node_procs: Sequence[int]
    launcher: str
    framework: Framework
    ray: RaySpecJSON | None
    k8s: K8sSpecJSON | None


class _RelayOption(TypedDict, total=False):
    #: the node's relay (`node.relay`): its IOPub and shell sockets, Unix socket paths on
    #: the notebook's side of any tunnel; absent for a rank reached on its own sockets
    relay_iopub: str
    relay_shell: str


class KernelConnection(_RelayOption):
    """A rank kernel's sockets, as jupyter_client writes a connection file, less the key
    (the session's, sent apart)."""

    shell_port: int
    iopub_port: int
    stdin_port: int
    control_port: int
    hb_port: int
    ip: str
    transport: Transport
    signature_scheme: str
    kernel_name: str


# -- a session's status (`Session.status`, ``GET /sessions``) ------------------------------
class NodeStatus(TypedDict):
    node_rank: int
    host: str
    agent_pid: int | None
    gpus: list[GPUJSON]
    lost: bool


class RankStatus(TypedDict):
    rank: int
    local_rank: int
    node_rank: int
    host: str
    pid: int | None
    state: RankStateName
    exit: str | None  # how it exited, in words (`describe_returncode`)
    returncode: int | None
    exit_tail: str
    log: str
    busy_since: float | None  # epoch s its current cell began (None: idle)
    last_error: str  # the error line of its last failed cell ("" if its last cell passed)
    group: str  # its default process group's backend after its last cell ("": none)


class SenderJSON(TypedDict):
    """Who sent a request: a notebook's path (as the server knows it) and its kernel."""

    path: str
    kernel_id: str


class NotebookJSON(SenderJSON):
    since: float  # epoch s it attached


class TurnStatus(SenderJSON):
    """A request for the session's ranks (`control.cell_queue.Turn`)."""

    turn_id: str
    kind: str  # "cell", "pull" or "push"
    ranks: list[int]  # [] = every rank
    queued_at: float
    started: float | None


class QueueStatus(TypedDict):
    running: TurnStatus | None
    queue: list[TurnStatus]


class _ClusterPlace(TypedDict, total=False):
    namespace: str  # k8s: where the session's Job and Secret are
    context: str | None  # k8s: the kubeconfig context that reached it


class ClusterHold(_ClusterPlace):
    """What a session holds on a cluster manager, found by name there
    (`control.launchers.base.Placement.hold`): a later server sweeps a dead one's."""

    kind: str  # the launcher: "ray" or "k8s"
    address: str  # the cluster, as the owner's driver reached it
    owner: str  # ``user@host/pid``: everything the owner named is under it


class HealRequest(TypedDict, total=False):
    """``POST /sessions/NAME/heal``: replace what failed (and ``ranks``), after taking
    ``spares`` (hosts a lost node may move to, as ``--hosts`` writes them) and ``auto``
    (heal lost nodes before the next cell unasked); ``now`` false only takes those."""

    ranks: list[int]
    spares: list[str]
    auto: bool
    now: bool
    #: why every rank joins a new group though none is replaced (ranks freed from a
    #: collective), in words
    new_group: str


class ResizeRequest(TypedDict, total=False):
    """``POST /sessions/NAME/resize``: ``counts`` ranks on each node from now on."""

    counts: list[int]
    spares: list[str]


class RecoveryReply(TypedDict):
    """What a heal or a resize did, in words, and the session after it."""

    said: str
    status: SessionStatus


class SessionStatus(TypedDict):
    """A JSON-able picture of a session, for ``%dist status``, the UI and the REST API."""

    name: str
    state: SessionStateName
    shape: str
    spec: SpecJSON
    world_size: int
    backend: Backend
    device: Device
    cells_run: int
    broken_reason: str
    #: how many times every rank joined a new process group (ranks replaced, resized)
    generation: int
    #: what happened to each rank a heal will replace, in words (empty when READY)
    faults: list[str]
    #: the ranks the last heal or resize started empty (where ``%dist sync`` copies to)
    replaced: list[int]
    master: str | None  # "addr:port" once the rendezvous is planned
    nodes: list[NodeStatus]
    ranks: list[RankStatus]
    started_at: float  # epoch s it became ready (0 before)
    straggler_s: float  # seconds a rank may run on beside finished ones before it is named
    notebook: str  # the notebook that started it, its path now ("" if none did)
    notebook_id: str  # that notebook's file id, which renames keep ("" if not known)
    notebooks: list[NotebookJSON]  # the notebook kernels attached to it
    running: TurnStatus | None  # the request its ranks run now, and its sender
    queue: list[TurnStatus]  # the requests waiting for its ranks, in order
    cluster: ClusterHold | None  # what it holds on a cluster manager (None: no cluster)


# -- connection details (`Session.connection_info`, ``GET /sessions/NAME/connection``) -----
class RankConnection(TypedDict):
    rank: int
    local_rank: int
    node_rank: int
    host: str
    connection: KernelConnection | None  # reachable from the owner's machine


class SessionConnection(TypedDict):
    """What another process needs to talk to a session's rank kernels itself. Secret."""

    name: str
    key: str
    signature_scheme: str
    ranks: list[RankConnection]


# -- the control plane's change events (`SessionManager.subscribe`, ``GET /events``) -------
class SessionChanged(TypedDict):
    type: Literal["session"]
    session: SessionStatus


class SessionRemoved(TypedDict):
    type: Literal["removed"]
    name: str


class SessionProgress(TypedDict):
    type: Literal["progress"]
    name: str
    text: str


class Snapshot(TypedDict):
    """The first event of the server's stream: every session as it is."""

    type: Literal["snapshot"]
    sessions: list[SessionStatus]


class SessionNotice(TypedDict):
    """Someone interrupted, restarted or shut down a session, or a sender went away:
    every notebook attached to it is told who and what was lost."""

    type: Literal["notice"]
    name: str
    action: str  # "interrupt", "restart", "shutdown" or "sender-gone"
    by: SenderJSON
    text: str


ManagerEvent = SessionChanged | SessionRemoved | SessionProgress | SessionNotice
ServerEvent = Snapshot | SessionChanged | SessionRemoved | SessionProgress | SessionNotice


# -- REST bodies ---------------------------------------------------------------------------
class TurnRequest(TypedDict, total=False):
    """``POST /sessions/NAME/turns``: ask for (or wait on) a turn on the session's ranks."""

    turn_id: str
    kind: str
    ranks: list[int]
    sender: SenderJSON


class TurnReply(TypedDict):
    turn_id: str
    state: str  # "running", "waiting" or "withdrawn"
    running: TurnStatus | None  # whose turn it is (for a waiting one)


class TurnEnd(TypedDict, total=False):
    """``POST /sessions/NAME/turns/ID/end``: the turn is over (or withdrawn)."""

    errors: dict[str, str]  # rank -> its error line, for the ranks that failed
    ran: list[int]


class SessionRequest(TypedDict, total=False):
    """``POST /sessions``: what to start (a `common.spec.ShapeRequest`) and where."""

    name: str
    nodes: int
    gpus: int | list[int]
    procs: int | list[int]
    backend: str
    init: bool
    framework: str
    hosts: list[HostJSON]
    python: str
    ssh_config: str
    launcher: str
    ray: RaySpecJSON
    k8s: K8sSpecJSON
    cwd: str
    env: dict[str, str]
    notebook: str  # the session is named after this notebook (the sender's path)


class NotebookSession(TypedDict):
    """``GET /notebook``: the asking notebook, and its session."""

    path: str  # the notebook's path now (renames followed)
    file_id: str  # its file's id, which renames keep ("" where the server has none)
    session: str | None  # the session it last used, else one it started, if one runs
    name: str  # the name its new session gets ("" when its kernel did not say its path)
    lost: str  # what became of its last session, when none runs ("" if nothing is known)


class StackGroup(TypedDict):
    """Ranks at the same place, as ``%dist stacks`` groups them."""

    ranks: list[int]
    place: str  # "in all_reduce (distributed_c10d.py:2810), cell line 3"
    frames: list[str]  # from the cell's frame inward


class StacksReply(TypedDict):
    """``POST /sessions/NAME/stacks``: faulthandler's text by rank (keys are strings), and
    the ranks grouped by where they are, the biggest group first."""

    stacks: dict[str, str]
    groups: list[StackGroup]


#: a rank's two logs: what its cells showed, and its process's diagnostics
LogKind = Literal["output", "diagnostics"]
LOG_KINDS: tuple[LogKind, ...] = ("output", "diagnostics")


class RankLog(TypedDict):
    """``GET /sessions/NAME/ranks/R/log?kind=K``: a piece of a rank's log (``kind``
    ``output``: what its cells showed; ``diagnostics``: its process log) from byte
    ``offset`` (later than the one asked when the log dropped it, 0 when the log started
    again); ``end`` is where the next piece starts (poll with it to follow the log)."""

    rank: int
    kind: LogKind
    path: str
    offset: int
    end: int
    text: str


# -- the agent protocol (`common.agent_protocol`) ------------------------------------------
class SpawnCommand(TypedDict):
    op: Literal["spawn"]
    rank: int
    local_rank: int
    env: dict[str, str]
    key: str
    cwd: str


class SignalCommand(TypedDict):
    op: Literal["signal"]
    rank: int
    signal: str  # a `signal.Signals` name, "SIGINT"


class KillCommand(TypedDict):
    op: Literal["kill"]
    ranks: list[int] | None  # None: every rank of the node
    grace: float


class RouteCommand(TypedDict):
    op: Literal["route"]
    id: str
    addr: str


class ProbeCommand(TypedDict):
    op: Literal["probe"]
    id: str
    addr: str
    port: int
    timeout_s: float


class _StacksOptions(TypedDict, total=False):
    fallback: bool  # faulthandler's signal, for ranks whose own thread did not answer


class StacksCommand(_StacksOptions):
    op: Literal["stacks"]
    id: str
    ranks: list[int] | None


class FreeCommand(TypedDict):
    """Ask ``ranks`` to free their main thread from a collective of their process group
    (`rank.group_sockets`)."""

    op: Literal["free"]
    id: str
    ranks: list[int]


class SampleCommand(TypedDict):
    op: Literal["sample"]
    id: str


class _ReadLogOptions(TypedDict, total=False):
    kind: LogKind  # "diagnostics" when left out


class ReadLogCommand(_ReadLogOptions):
    op: Literal["read_log"]
    id: str
    rank: int
    offset: int


class ReadLogReply(TypedDict):
    """``read_log``'s answer: the text, the offset it starts at (the one asked, unless
    the log dropped it or started again), the offset after it, and the log's path."""

    text: str
    start: int
    end: int
    path: str


class ShutdownCommand(TypedDict):
    op: Literal["shutdown"]


class PingCommand(TypedDict):
    """The owner's heartbeat: the agent answers `PongEvent` and, from the first one on,
    stops its ranks and exits once it has heard nothing for ``deadline_s``."""

    op: Literal["ping"]
    seq: int
    deadline_s: float


AgentCommand = (
    SpawnCommand
    | SignalCommand
    | KillCommand
    | RouteCommand
    | ProbeCommand
    | StacksCommand
    | FreeCommand
    | ReadLogCommand
    | SampleCommand
    | ShutdownCommand
    | PingCommand
)
AgentOp = Literal[
    "spawn",
    "signal",
    "kill",
    "route",
    "probe",
    "stacks",
    "free",
    "read_log",
    "sample",
    "shutdown",
    "ping",
]
#: the commands answered by a ``reply`` event with the command's ``id``
RequestOp = Literal["route", "probe", "stacks", "free", "read_log", "sample"]


# -- live samples (``sample``; ``GET /sessions/NAME/metrics``) -----------------------------
class GPUSample(TypedDict):
    index: int
    name: str
    util_percent: float
    mem_used_mib: float
    mem_total_mib: float


class RankSample(TypedDict):
    rank: int
    pid: int
    cpu_percent: float | None  # of one core; None: the process is gone
    rss_mib: float | None


class NodeSample(TypedDict):
    cpu_percent: float  # of the whole machine
    cpus: int
    mem_used_mib: float
    mem_total_mib: float
    gpus: list[GPUSample]
    ranks: list[RankSample]


class NodeMetrics(TypedDict):
    node_rank: int
    host: str
    cpu_percent: float | None
    cpus: int
    mem_used_mib: float | None
    mem_total_mib: float | None
    gpus: list[GPUSample]
    error: str  # why this node gave no sample ("" when it did)


class SessionMetrics(TypedDict):
    """One ``metrics`` event: every node's and rank's sample at ``time`` (epoch s)."""

    time: float
    nodes: list[NodeMetrics]
    ranks: list[RankSample]


class ReadyEvent(TypedDict):
    event: Literal["ready"]
    protocol: int
    host: str
    pid: int
    python: str
    dir: str
    gpus: list[GPUJSON]
    free_port: int
    versions: dict[str, str | None]  # jupyter_dist, torch (None: none), python
    preload_errors: dict[str, str]  # module -> "ExceptionType: message"


class SpawnedEvent(TypedDict):
    event: Literal["spawned"]
    rank: int
    pid: int
    connection: KernelConnection
    log: str


class ExitedEvent(TypedDict):
    event: Literal["exited"]
    rank: int
    pid: int
    returncode: int
    log_tail: str
    log: str


class ReplyFields(TypedDict, total=False):
    """What a reply carries besides its ``id``; which fields depends on the op."""

    # route: how this node reaches ``addr`` (``error`` when it cannot)
    addr: str
    ip: str | None
    ifname: str | None
    # route, probe: "ExceptionType: message"
    error: str
    # probe: whether a TCP connection to ``addr:port`` opened
    ok: bool
    # stacks: rank (as a string) -> where its log ended before the dump
    offsets: dict[str, int]
    # free: the ranks asked
    ranks: list[int]
    # read_log: the text, where it starts, the byte offset after it, the log's path
    text: str
    start: int
    end: int
    path: str
    # sample
    sample: NodeSample


class ReplyEvent(ReplyFields):
    """The answer to a `RequestOp` command."""

    event: Literal["reply"]
    id: str


class _ErrorOptions(TypedDict, total=False):
    id: str  # the request that failed, when a request did


class AgentErrorEvent(_ErrorOptions):
    event: Literal["error"]
    message: str
    rank: int | None


class PongEvent(TypedDict):
    """The agent's answer to a `PingCommand`, with its ``seq``."""

    event: Literal["pong"]
    seq: int


AgentEvent = ReadyEvent | SpawnedEvent | ExitedEvent | ReplyEvent | AgentErrorEvent | PongEvent
AgentEventKind = Literal["ready", "spawned", "exited", "reply", "error", "pong"]
