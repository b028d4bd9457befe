"""``%%distributed`` and ``%dist``: parse the arguments, then delegate.

``%%distributed?`` and ``%dist?`` print the argparse manual generated from the
decorators below.
"""

from __future__ import annotations

import argparse
import ast
import os
import queue
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from IPython.core.error import UsageError
from IPython.core.getipython import get_ipython
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import publish_display_data

from jupyter_dist.common import cluster_env, pickling
from jupyter_dist.common.bounded import parse_seconds, parse_whole, shown
from jupyter_dist.common.events import CellEvent, Notice
from jupyter_dist.common.hosts import (
    MAX_NODES,
    HostSpec,
    check_node_count,
    check_python,
    check_ssh_config,
    parse_hosts,
    read_hostfile,
)
from jupyter_dist.common.k8s_options import (
    MAX_DEADLINE_S,
    MAX_GRACE_S,
    K8sSpec,
    read_pod_template,
)
from jupyter_dist.common.launcher_options import check_launcher_options, given_options
from jupyter_dist.common.payloads import SessionStatus
from jupyter_dist.common.ray_options import MAX_BUNDLE_UNITS, MAX_WAIT_S, RaySpec, check_strategy
from jupyter_dist.common.spec import (
    DEFAULT_SESSION,
    MAX_WORLD_SIZE,
    ShapeRequest,
    check_same_shape,
    check_seconds,
    check_session_name,
    parse_counts,
    parse_framework,
    parse_names,
    parse_ranks,
    validate_request,
)
from jupyter_dist.control.event_queue import EventQueue
from jupyter_dist.control.rank_group import OBJECTS_TIMEOUT_S, RankGroup
from jupyter_dist.control.recovery import SessionState
from jupyter_dist.display.render_text import TextRenderer
from jupyter_dist.display.status_lines import StatusLines
from jupyter_dist.errors import DistError, SpecError
from jupyter_dist.notebook import owners as planes
from jupyter_dist.notebook.cell_loop import Renderer, run_cell, wait_with_notices
from jupyter_dist.notebook.owners import SessionOwner, session_owner
from jupyter_dist.notebook.profile_args import ProfileUse, apply_profile, in_profile_words
from jupyter_dist.settings import OUTPUT_VAR
from jupyter_dist.text import ranks_label

#: what ``--output`` and ``JUPYTER_DIST_OUTPUT`` may say; ``auto`` picks one of the views
OutputMode = Literal["auto", "widget", "text"]
CellViewKind = Literal["widget", "text"]
OUTPUT_MODES: tuple[OutputMode, ...] = ("auto", "widget", "text")
#: seconds the cell view's stacks button waits for the ranks' dumps
STACKS_READ_S = 15.0
#: ``%%distributed`` lines whose parsed arguments are kept (`DistMagics._cell_args`)
PARSED_LINES = 32
#: each ``%dist`` command as it is typed, and what it does: ``%dist`` alone lists them
DIST_HELP: dict[str, str] = {
    "status": "the sessions, their ranks and what each is doing",
    "stacks": "where every rank is right now (also while ranks hang in a collective)",
    "debug": "[--rank N] open pdb on the traceback of the last failed cell, on its "
    "root-cause rank (or rank N), as %debug does in one kernel",
    "attach NAME": "make session NAME this notebook's session",
    "shutdown": "stop the session's ranks (--all: every session)",
    "restart": "start the session's ranks afresh, same shape (their variables are lost)",
    "heal": "replace dead or stuck ranks and lost nodes (--spares HOST,...: hosts that may "
    "take a node's place); every other rank keeps its variables",
    "resize": "--nodes N (or --procs P on one node): add or remove ranks at the end, keeping "
    "every remaining rank's variables",
    "sync NAMES": "--from RANK [--to RANKS]: copy variables rank to rank over the process "
    "group (models and optimizers by state_dict); to the ranks the last heal replaced, "
    "else to every other",
    "interrupt": "stop the cell running on the ranks, as the stop button does",
    "push NAMES": "copy notebook variables to the ranks",
    "pull NAME": "return a variable of the ranks, one value per rank",
    "profiles": "the launcher profiles (--profile NAME) of this user's Jupyter config folder",
}
DIST_COMMANDS = tuple(usage.split()[0] for usage in DIST_HELP)
#: said under a notebook server when a cell starts a session: where to look at it
SIDEBAR_POINTER = (
    "sessions, ranks and their logs: the Distributed sidebar (View > Show distributed sessions)"
)


def _display(data: dict[str, Any], metadata: dict[str, Any]) -> None:
    publish_display_data(data=data, metadata=metadata)


def whose_words(name: str, owner: str) -> str:
    """What a notebook is told when it joins session ``name``, which notebook ``owner``
    started."""
    return (
        f"session {name!r} belongs to {owner}, which started it: this notebook's cells run "
        "on its ranks, beside that notebook's variables"
    )


def _renderer(ranks: list[int], summary: bool = False) -> TextRenderer:
    """The text view; in a notebook kernel, what a cell waits for is one line that
    updates (a terminal has no such line: there it is printed when it changes)."""
    shell = get_ipython()
    in_kernel = getattr(shell, "kernel", None) is not None
    status = StatusLines() if in_kernel else None
    return TextRenderer(ranks, sys.stdout, sys.stderr, _display, summary=summary, status=status)


def output_mode(shell: Any, asked: str | None) -> CellViewKind:
    """``widget`` in a notebook kernel (a frontend that can draw widgets may be there),
    ``text`` in a terminal; ``--output`` or ``JUPYTER_DIST_OUTPUT`` decide first."""
    mode = (asked or os.environ.get(OUTPUT_VAR) or "auto").strip().lower()
    if mode not in OUTPUT_MODES:
        where = f"--output {asked!r}" if asked else f"{OUTPUT_VAR}={mode!r}"
        raise SpecError(f"{where}: expected one of {', '.join(OUTPUT_MODES)}")
    if mode == "auto":
        return "widget" if getattr(shell, "kernel", None) is not None else "text"
    return "widget" if mode == "widget" else "text"


def _ray_spec(args: Any) -> RaySpec | None:
    """The ``--ray`` options as a `RaySpec` (any ``--ray-*`` flag implies ``--ray``), or
    None when no Ray flag is given."""
    flags = (
        args.ray_address,
        args.ray_strategy,
        args.ray_runtime_env,
        args.ray_cpus,
        args.ray_gpus,
        args.ray_timeout,
        args.ray_resources,
    )
    if not args.ray and all(v is None for v in flags):
        return None
    units = MAX_BUNDLE_UNITS
    return RaySpec(
        address=args.ray_address,
        strategy=check_strategy(args.ray_strategy) if args.ray_strategy else RaySpec.strategy,
        runtime_env=args.ray_runtime_env or "",
        cpus=1 if args.ray_cpus is None else parse_whole("--ray-cpus", args.ray_cpus, 1, units),
        gpus=None if args.ray_gpus is None else parse_whole("--ray-gpus", args.ray_gpus, 0, units),
        timeout=(
            None
            if args.ray_timeout is None
            else parse_seconds("--ray-timeout", args.ray_timeout, MAX_WAIT_S)
        ),
        resources=args.ray_resources or "",
    )


def _count(low: int, high: int, what: str) -> Callable[[str], int]:
    """A count option's text (``--nodes``, ``--from``) as a number, its value checked
    later; more digits than any count has are refused here, naming the range, without
    being converted."""

    def parse(text: str) -> int:
        if re.fullmatch(r"\s*[+-]?[0-9]{1,9}\s*", text) is None:
            raise argparse.ArgumentTypeError(f"{shown(text)}: expected {what}, {low} to {high}")
        return int(text)

    return parse


def _k8s_spec(args: Any) -> K8sSpec | None:
    """The ``--k8s`` options as a `K8sSpec` (any of its flags implies ``--k8s``), or None
    when none is given."""
    given = {
        "namespace": args.namespace,
        "context": args.context,
        "image": args.image,
        "cpus": args.cpus,
        "memory": args.memory,
        "node_selector": tuple(args.node_selector or ()),
        "tolerations": tuple(args.toleration or ()),
        "pod_template": args.pod_template,
        "callback": args.k8s_callback,
        # read as text, checked against their ranges before converting (`bounded`)
        "timeout": (
            None
            if args.k8s_timeout is None
            else parse_seconds("--k8s-timeout", args.k8s_timeout, MAX_WAIT_S)
        ),
        "deadline": (
            None
            if args.k8s_deadline is None
            else parse_whole("--k8s-deadline", args.k8s_deadline, 60, MAX_DEADLINE_S)
        ),
        "grace": (
            None
            if args.k8s_grace is None
            else parse_seconds("--k8s-grace", args.k8s_grace, MAX_GRACE_S)
        ),
        "queue": args.k8s_queue,
        "queue_timeout": (
            None
            if args.k8s_queue_timeout is None
            else parse_seconds("--k8s-queue-timeout", args.k8s_queue_timeout, MAX_WAIT_S)
        ),
        "gang_timeout": (
            None
            if args.k8s_gang_timeout is None
            else parse_seconds("--k8s-gang-timeout", args.k8s_gang_timeout, MAX_WAIT_S)
        ),
        "priority_class": args.k8s_priority_class,
        "scheduler": args.k8s_scheduler,
        "gpu_resource": args.k8s_gpu_resource,
    }
    if not args.k8s and all(v in (None, ()) for v in given.values()):
        return None
    spec = K8sSpec(**{k: v for k, v in given.items() if v not in (None, ())})
    if spec.pod_template is not None:
        read_pod_template(spec.pod_template)  # its errors now, before anything starts
    return spec


def _launchers_chosen(args: Any) -> list[tuple[str, str]]:
    """The launchers the line chooses, each once: (kind, the flag that chose it)."""
    chosen: dict[str, str] = {}
    for kind, flag, given in (
        ("ssh", "--hosts", args.hosts),
        ("ssh", "--hostfile", args.hostfile),
        ("slurm", "--slurm", args.slurm),
        ("ray", "--ray", args.ray),
        ("k8s", "--k8s", args.k8s),
    ):
        if given:
            chosen.setdefault(kind, flag)
    return list(chosen.items())


def _check_syntax(shell: Any, cell: str) -> None:
    """Refuse a cell with a syntax error before anything is sent to the ranks."""
    source = shell.transform_cell(cell) if shell is not None else cell
    try:
        compile(source, "<cell>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    except SyntaxError as err:
        line = (err.text or "").rstrip()
        raise SpecError(
            f"the cell has a syntax error at line {err.lineno}: {err.msg}"
            + (f"\n    {line}" if line else "")
            + "\nNothing was sent to the ranks."
        ) from None


def interrupt_words(name: str, status: SessionStatus | None, ranks: Sequence[int] | None) -> str:
    """What ``%dist interrupt`` did, by the session's status just before it: the ranks
    that were running code, and whose request they ran, or that none was."""
    chosen = None if ranks is None else set(ranks)
    busy = [
        r["rank"]
        for r in (status["ranks"] if status is not None else [])
        if r["state"] == "busy" and (chosen is None or r["rank"] in chosen)
    ]
    running = status["running"] if status is not None else None
    if not busy and running is not None:  # granted its turn, not sent to the ranks yet
        busy = running["ranks"] or [r["rank"] for r in status["ranks"]] if status else []
    if not busy:
        return f"session {name!r}: no rank was running code; nothing to interrupt"
    whose = ""
    if running is not None:
        whose = f", running a {running['kind']} from {running['path'] or 'another client'}"
    return (
        f"interrupted {ranks_label(busy)} of session {name!r}{whose}; what was running "
        "there says how it stopped"
    )


@magics_class
class DistMagics(Magics):
    """The jupyter_dist magics."""

    def __init__(self, shell: Any, plane: SessionOwner | None = None) -> None:
        super().__init__(shell)
        self._control = plane
        #: the session this notebook last used: its last cell's (``--session NAME`` or
        #: none) or ``%dist attach``'s; None: none yet in this kernel (the sessions' owner
        #: may know the one the notebook used before, `SessionRegistry.last_used`)
        self._current: str | None = None
        #: the session the last cell that named none was said to run on
        self._announced = ""
        #: the sessions this kernel was told belong to another notebook
        self._told_whose: set[str] = set()
        self._cells = 0
        self._parsed_lines: dict[str, argparse.Namespace] = {}  # `_cell_args`
        #: (session, --heal, --spares) told to the sessions' owner already
        self._policies_sent: set[tuple[str, bool, str]] = set()
        #: the nodes of a Slurm allocation a session does not use (``--slurm --nodes N``):
        #: they take a lost node's place, as ``--spares`` hosts do
        self._allocation_spares: dict[str, tuple[HostSpec, ...]] = {}
        self.last_view: Any = None  # the latest cell view (tests and debugging look at it)
        self._count: int | None = None  # the running notebook cell's execution count
        events = getattr(shell, "events", None)
        if events is not None:
            events.register("pre_run_cell", self._note_count)

    def _note_count(self, info: Any) -> None:
        """The running cell's number, as the notebook shows it (``[4]``): IPython has
        already counted past it when a cell runs, if the cell goes into the history."""
        count = getattr(self.shell, "execution_count", None)
        stored = bool(getattr(info, "store_history", False))
        if isinstance(count, int):
            self._count = count - 1 if stored else count

    @property
    def control(self) -> SessionOwner:
        if self._control is None:
            self._control = session_owner()
        return self._control

    def _name(self, given: str | None) -> str:
        """The session a command means: ``--session``, else the one this notebook last
        used while it runs (whatever started it), else this notebook's own (``default``;
        under a server, named after the notebook)."""
        if given:
            return check_session_name(given)
        last = self._last_used()
        if last and self.control.manager.is_running(last):
            return last
        return check_session_name(self.control.manager.default_name)

    def _last_used(self) -> str:
        return self.control.manager.last_used if self._current is None else self._current

    def _said_before(self, given: str | None, name: str) -> list[str]:
        """What a cell that names no session says before it runs on ``name``: that the
        session this notebook used last is gone."""
        last = self._last_used()
        if given or not last or last == name:
            return []
        return [f"session {last!r}, which this notebook last used, is no longer running"]

    def _said_after(self, given: str | None, name: str, started: bool) -> list[str]:
        """What a cell says once it has its session: whose it is, if another notebook
        started it (said once a session), and which it is, for a cell that named none
        (said when it is another than the last such cell ran on)."""
        manager = self.control.manager
        said = []
        owner = manager.belongs_to(name)
        if owner and name not in self._told_whose:
            self._told_whose.add(name)
            said.append(whose_words(name, owner))
        # the first cell after a kernel restart goes on with the session the notebook last
        # used: its attach line says so already
        resumed = self._current is None and name == manager.last_used
        if not (given or started or resumed) and name not in (
            self._announced,
            manager.default_name,
        ):
            said.append(
                f"running on session {name!r}, the one this notebook last used "
                "(`--session NAME` for another)"
            )
        if not given:
            self._announced = name
        self._current = name
        return said

    # -- helpers ------------------------------------------------------------------------
    def _call(self, make: Callable[[queue.SimpleQueue[CellEvent]], Any]) -> Any:
        """Run a control-plane coroutine, drawing its progress notices as they come."""
        sink: queue.SimpleQueue[CellEvent] = EventQueue()
        future = self.control.loop.submit(make(sink))
        return wait_with_notices(future, sink, _renderer([]))

    def _session(self, name: str | None) -> RankGroup:
        return self.control.run(self.control.manager.find(self._name(name)))

    def _user_values(self, names: list[str]) -> dict[str, Any]:
        ns = self.shell.user_ns if self.shell is not None else {}
        missing = [n for n in names if n not in ns]
        if missing:
            raise SpecError(
                f"--push {','.join(names)}: {missing[0]!r} is not defined in the notebook"
            )
        return {n: ns[n] for n in names}

    # -- %%distributed --------------------------------------------------------------------
    @magic_arguments()
    @argument(
        "--profile",
        default=None,
        metavar="NAME",
        help="start from the launcher settings of profile NAME (`%%dist profiles` lists "
        "them); options given in the cell override the profile's",
    )
    @argument(
        "--nodes",
        type=_count(1, MAX_NODES, "a number of nodes"),
        default=None,
        help="number of nodes (default: 1, or the number of hosts given)",
    )
    @argument(
        "--hosts",
        default=None,
        help="nodes over SSH: name, user@name or name:port, comma separated; names "
        "may be ~/.ssh/config aliases",
    )
    @argument(
        "--hostfile",
        default=None,
        help="a file with one host a line, optionally 'slots=N' (ranks on it)",
    )
    @argument(
        "--python",
        default=None,
        help="the Python that runs the agent and ranks on each node, this machine's "
        "too (default: the notebook's path if the node has it, else python3)",
    )
    @argument(
        "--slurm",
        action="store_true",
        help="inside a Slurm allocation: its nodes (SLURM_JOB_NODELIST), agents started with srun",
    )
    @argument(
        "--ray",
        action="store_true",
        help="place the nodes on a Ray cluster: one placement-group bundle and one actor per "
        "node, which starts its agent (--ray-address, else RAY_ADDRESS, else auto)",
    )
    @argument(
        "--ray-address",
        default=None,
        help="the Ray cluster's GCS address HOST:PORT, or auto (implies --ray; default: "
        "RAY_ADDRESS, else auto)",
    )
    @argument(
        "--ray-strategy",
        default=None,
        help="how the nodes' bundles are placed: STRICT_SPREAD (default: one machine each), "
        "PACK (as few machines as fit) or SPREAD (implies --ray)",
    )
    @argument(
        "--ray-runtime-env",
        default=None,
        help='Ray runtime environment of the node actors, JSON, e.g. \'{"pip": '
        '["jupyter_dist"]}\' (implies --ray)',
    )
    @argument(
        "--ray-cpus",
        default=None,
        help="CPUs each node's bundle holds (default 1; implies --ray)",
    )
    @argument(
        "--ray-gpus",
        default=None,
        help="GPUs each node's bundle holds (default: the --gpus count, 0 with --procs; "
        "implies --ray)",
    )
    @argument(
        "--ray-timeout",
        default=None,
        help="seconds to wait for the Ray cluster to have room for the nodes, or for Ray's "
        "autoscaler to add nodes (default: the session's start timeout; implies --ray)",
    )
    @argument(
        "--ray-resources",
        default=None,
        help="what else each node's bundle holds, as Ray's resources={...}: NAME=AMOUNT,... "
        "or a JSON object, e.g. TPU=4 or '{\"my_resource\": 2}'; accelerator_type=A100 as "
        "Ray's accelerator_type= (implies --ray)",
    )
    @argument(
        "--k8s",
        action="store_true",
        help="run the nodes as pods of one Kubernetes Job (kubeconfig or in-cluster service "
        "account); they dial back to this notebook",
    )
    @argument("--namespace", default=None, help="--k8s: the namespace (default: the context's)")
    @argument("--context", default=None, help="--k8s: the kubeconfig context (default: current)")
    @argument(
        "--image",
        default=None,
        help="--k8s: the pods' image, with jupyter_dist installed (default: this notebook "
        "pod's image)",
    )
    @argument("--cpus", default=None, help="--k8s: CPUs of each pod, e.g. 8 or 500m")
    @argument("--memory", default=None, help="--k8s: memory of each pod, e.g. 64Gi")
    @argument(
        "--node-selector",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="--k8s: a label the pods' machines must have (repeatable)",
    )
    @argument(
        "--toleration",
        action="append",
        default=None,
        metavar="KEY[=VALUE]:EFFECT",
        help="--k8s: a taint the pods tolerate, e.g. nvidia.com/gpu:NoSchedule (repeatable)",
    )
    @argument(
        "--pod-template",
        default=None,
        help="--k8s: a YAML/JSON pod template merged under what the flags set (volumes, "
        "service account, devices)",
    )
    @argument(
        "--k8s-callback",
        default=None,
        metavar="HOST:PORT",
        help="--k8s: the address the pods dial back to (default: this pod's IP, in-cluster)",
    )
    @argument(
        "--k8s-timeout",
        default=None,
        help="--k8s: seconds to wait for the pods to be scheduled and connected (default: "
        "the session's start timeout)",
    )
    @argument(
        "--k8s-deadline",
        default=None,
        help="--k8s: seconds the session's Job may live (default 7 days)",
    )
    @argument(
        "--k8s-grace",
        default=None,
        help="--k8s: seconds a pod keeps dialling a notebook it lost before it exits (default 60)",
    )
    @argument(
        "--k8s-queue",
        default=None,
        metavar="NAME",
        help="--k8s: a Kueue LocalQueue of the namespace; the Job waits, suspended, until Kueue "
        "admits all its pods at once",
    )
    @argument(
        "--k8s-queue-timeout",
        default=None,
        help="--k8s: seconds the session may wait in its queue (default 3600)",
    )
    @argument(
        "--k8s-gang-timeout",
        default=None,
        help="--k8s: seconds for every pod to be on a machine, else all are released (default 60)",
    )
    @argument(
        "--k8s-priority-class",
        default=None,
        metavar="NAME",
        help="--k8s: the pods' PriorityClass",
    )
    @argument(
        "--k8s-scheduler",
        default=None,
        metavar="NAME",
        help="--k8s: the scheduler that places the pods (volcano, scheduler-plugins-scheduler)",
    )
    @argument(
        "--k8s-gpu-resource",
        default=None,
        metavar="NAME",
        help="--k8s: the resource each pod's --gpus are asked as (default nvidia.com/gpu; "
        "nvidia.com/mig-1g.10gb, amd.com/gpu)",
    )
    @argument("--ssh-config", default=None, help="ssh config file (default: ~/.ssh/config)")
    @argument(
        "--gpus",
        default=None,
        help="ranks per node, one per CUDA device, NCCL backend; one count, or one per node "
        "like 4,2",
    )
    @argument(
        "--procs",
        default=None,
        help="CPU ranks per node, gloo backend; one count, or one per node like 2,1 (at most "
        "JUPYTER_DIST_MAX_RANKS_PER_NODE; default twice the CPUs, at least 8)",
    )
    @argument("--backend", default=None, help="process group backend: nccl or gloo")
    @argument("--ranks", default=None, help="run on these ranks only, e.g. 0,2-3")
    @argument(
        "--session",
        default=None,
        help=f"session name; several sessions can run side by side (default: {DEFAULT_SESSION!r}, "
        "or under a Jupyter server the notebook's name and a short hash of its path)",
    )
    @argument("--push", default=None, help="notebook variables to send to the ranks first: a,b")
    @argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds (finite, positive) before the ranks are interrupted and the cell "
        "fails; a rank blocked in a collective is freed, one that cannot be stopped is "
        "replaced alone",
    )
    @argument(
        "--heal",
        action="store_true",
        help="a lost node is started again before the next cell without `%%dist heal` "
        "(dead and stuck ranks are always replaced)",
    )
    @argument(
        "--spares",
        default=None,
        help="hosts that may take a lost node's place, or be added by `%%dist resize`: "
        "h1,h2 as --hosts writes them",
    )
    @argument(
        "--no-init", action="store_true", help="do not create the torch.distributed process group"
    )
    @argument(
        "--framework",
        default=None,
        help="what each rank is given before the first cell: torch (default; the "
        "torch.distributed process group), jax (what jax.distributed.initialize() needs, "
        "called without arguments), or none",
    )
    @argument(
        "--output",
        default=None,
        help="how output is shown: widget (a view per rank, status, charts), text (prefixed "
        "lines), or auto (widget in a notebook, text in a terminal; JUPYTER_DIST_OUTPUT)",
    )
    @cell_magic
    def distributed(self, line: str, cell: str) -> None:
        """Run the cell on every rank of a session (started on first use).

        The first cell of a session chooses its shape, e.g. ``--procs 2`` (CPU, gloo) or
        ``--gpus 4`` (one rank per CUDA device, nccl); later cells reuse the running ranks
        and their variables. Each rank sees torchrun's environment (RANK, LOCAL_RANK,
        WORLD_SIZE, MASTER_ADDR, ...) with the default process group initialised.
        ``--hosts``, ``--hostfile`` or ``--slurm`` put the ranks on other nodes over SSH;
        ``--ray`` places the nodes on a Ray cluster (one actor per node starts its agent,
        which dials back to this side over an encrypted connection).

        In a notebook a cell still running after a quarter of a second shows a widget view
        (one that ends sooner shows only its snapshot, or nothing if it ran fine and had
        nothing to show, as a plain cell): a status chip per rank, every rank's output,
        each line with its rank (identical lines folded), with a selector for any rank or
        node,
        live charts of what ranks send with ``jupyter_dist.log``, widgets ranks make, and a
        "stacks" button that shows where every rank is while the cell runs. When the cell
        ends, the view becomes a self-contained HTML snapshot (a block per rank, charts,
        summary) that a saved notebook, nbconvert and viewers show without a kernel.
        Elsewhere (or ``--output text``) output comes back as text prefixed ``[rank N]``.
        Each rank's full output, tracebacks included, is in a log file; past
        ``JUPYTER_DIST_OUTPUT_LIMIT`` (2M) a cell shows a marker naming it instead.

        A rank that raises or dies fails the cell with the root cause, its traceback shown
        once with its output, and the view turns to it; ranks left waiting for it are
        interrupted (or the session restarted, saying so) and shown as stopped, not failed.
        The stop button, ``%dist interrupt`` and ``--timeout`` end a cell within seconds:
        a rank handling the interrupt (its traceback, the cell's ``except``) is let finish;
        one blocked in a collective is freed from it, every rank keeping its variables and
        joining a new process group; only a rank that cannot be stopped is replaced alone. Rank
        tracebacks name the notebook's cell number. ``%dist stacks`` shows where ranks
        hang.
        """
        args = self._cell_args(line)
        use: ProfileUse | None = None
        try:
            if args.profile is not None:
                use = apply_profile(self.distributed.parser, args)
            self._distributed(args, cell)
        except DistError as err:
            if isinstance(err, SpecError):
                raise UsageError(str(in_profile_words(err, use))) from None
            raise

    def _cell_args(self, line: str) -> argparse.Namespace:
        """``%%distributed``'s arguments: parsed once for each line (a notebook's cells
        mostly repeat theirs; argparse is a tenth of what the magic costs a quick cell),
        a copy each time, its lists too."""
        parsed = self._parsed_lines.get(line)
        if parsed is None:
            parsed = parse_argstring(self.distributed, line)
            if len(self._parsed_lines) >= PARSED_LINES:
                self._parsed_lines.pop(next(iter(self._parsed_lines)))
            self._parsed_lines[line] = parsed
        return argparse.Namespace(
            **{k: list(v) if isinstance(v, list) else v for k, v in vars(parsed).items()}
        )

    def _distributed(self, args: Any, cell: str) -> None:
        name = self._name(args.session)
        check_seconds("--timeout", args.timeout)
        request = self._shape(args, name)
        mode = output_mode(self.shell, args.output)
        _check_syntax(self.shell, cell)
        ranks = parse_ranks(args.ranks) if args.ranks else None
        payload = pickling.dump(self._user_values(parse_names(args.push))) if args.push else None

        manager = self.control.manager
        before = self._said_before(args.session, name)

        async def start(sink: queue.SimpleQueue[CellEvent]) -> RankGroup:
            for text in before:
                sink.put(Notice(text))
            session, started = await manager.get_or_start(
                name, request, lambda text: sink.put(Notice(text))
            )
            if started:
                sink.put(Notice(f"session {name!r} ready: {session.spec.describe()}"))
                if isinstance(self.control, planes.ServerOwner):
                    sink.put(Notice(SIDEBAR_POINTER))
            for text in self._said_after(args.session, name, started):
                sink.put(Notice(text))
            return session

        running = manager.sessions.get(name)
        if running is not None and running.state == SessionState.READY and not running.stale:
            check_same_shape(running.spec, request)  # the common case: no loop round trip
            session = running
            for text in [*before, *self._said_after(args.session, name, False)]:
                print(f"[jupyter_dist] {text}")
        else:
            session = self._call(start)
        self._fault_policy(name, args)
        chosen = session.check_ranks(ranks)
        if payload is not None:
            self.control.run(session.push(payload, chosen))
        sink: queue.SimpleQueue[CellEvent] = EventQueue()
        renderer: Renderer
        if mode == "widget":
            renderer = self._cell_view(session, chosen)
        else:
            renderer = _renderer(chosen, summary=True)
        run_cell(self.control, session, cell, chosen, args.timeout, renderer, sink, self._count)

    def _fault_policy(self, name: str, args: Any) -> None:
        """``--heal`` and ``--spares`` go to the session's owner, once each as said."""
        allocation = self._allocation_spares.get(name, ())
        if not args.heal and not args.spares and not allocation:
            return
        said = (name, bool(args.heal), (args.spares or "") + repr(allocation))
        if said in self._policies_sent:
            return
        spares = (parse_hosts(args.spares, "--spares") if args.spares else ()) + allocation
        manager = self.control.manager
        self.control.run(
            manager.heal(name, spares=spares, auto=True if args.heal else None, now=False)
        )
        self._policies_sent.add(said)

    def _shape(self, args: Any, name: str) -> ShapeRequest:
        """What the arguments ask of the session: its nodes and ranks, checked (sizes,
        names, files) before anything starts anywhere."""
        if args.python is not None:
            check_python(args.python)
        if args.ssh_config is not None:
            check_ssh_config(args.ssh_config)
        check_launcher_options(_launchers_chosen(args), given_options(vars(args)))
        ray = _ray_spec(args)
        k8s = _k8s_spec(args)
        given = [f for f, v in (("--hosts", args.hosts), ("--hostfile", args.hostfile),
                                ("--slurm", args.slurm), ("--ray", ray), ("--k8s", k8s))
                 if v]  # fmt: skip
        if len(given) > 1:
            raise SpecError(f"{' and '.join(given)}: give one of them")
        hosts = (
            parse_hosts(args.hosts)
            if args.hosts
            else read_hostfile(args.hostfile)
            if args.hostfile
            else ()
        )
        gpus = parse_counts("--gpus", args.gpus) if args.gpus else None
        procs = parse_counts("--procs", args.procs) if args.procs else None
        fresh = name not in self.control.manager.sessions
        nodes = args.nodes
        if args.slurm:
            detected = cluster_env.detect_slurm(os.environ)
            if detected is None:
                raise SpecError(
                    "--slurm: not inside a Slurm allocation (no SLURM_JOB_ID / "
                    "SLURM_JOB_NODELIST); start the notebook server under salloc or sbatch, "
                    "or give the nodes with --hosts"
                )
        elif ray is not None or k8s is not None:
            detected = None
        else:
            detected = (
                cluster_env.detect_skypilot(os.environ) if not hosts and args.nodes != 1 else None
            )
        if detected is not None and (fresh or args.slurm):
            hosts = detected.hosts
            if args.slurm:  # the allocation's other nodes wait to take a lost one's place
                hosts, spare = cluster_env.split_allocation(detected, args.nodes)
                self._allocation_spares[name] = spare
                nodes = None  # the hosts say it
            if gpus is None and procs is None and detected.gpus_per_node:
                gpus = (detected.gpus_per_node,)
            if fresh:
                hint = "" if args.slurm else "; --nodes 1 for this machine only"
                spare = self._allocation_spares.get(name, ()) if args.slurm else ()
                if spare:
                    hint = (
                        f"; {', '.join(str(h) for h in spare)} of the allocation "
                        "take a lost node's place (`%dist heal`)"
                    )
                print(
                    f"[jupyter_dist] using the {detected.source} cluster: "
                    f"{len(hosts)} nodes ({', '.join(str(h) for h in hosts)}){hint}"
                )
        request = ShapeRequest(
            launcher="slurm"
            if args.slurm
            else "ray"
            if ray is not None
            else "k8s"
            if k8s is not None
            else None,
            ray=ray,
            k8s=k8s,
            nodes=nodes,
            gpus=gpus,
            procs=procs,
            backend=args.backend,
            init=False if args.no_init else None,
            framework=None if args.framework is None else parse_framework(args.framework),
            hosts=hosts,
            python=args.python,
            ssh_config=args.ssh_config,
        )
        validate_request(request)
        return request

    def _cell_view(self, session: RankGroup, ranks: list[int]) -> Renderer:
        from jupyter_dist.display.cell_view import CellView
        from jupyter_dist.display.widget_relay import relay_for_this_kernel

        self._cells += 1
        places = {r: (session.ranks[r].host, session.ranks[r].place.node_rank) for r in ranks}

        def read_stacks() -> str:  # on the click subshell's thread, while the cell runs
            from jupyter_dist.common import stacks

            return stacks.describe(self.control.run(session.stacks(ranks), STACKS_READ_S))

        view = CellView(
            session.name,
            self._cells,
            places,
            relay_for_this_kernel(),
            read_stacks=read_stacks,
            log_url=self._log_url(),
        )
        view.show()
        self.last_view = view
        return view

    def _log_url(self) -> Callable[[Path], str | None] | None:
        """Where the Jupyter server that owns this kernel's sessions serves cell logs."""
        from jupyter_dist.server_client.log_links import log_folder_url

        control = self.control
        if not isinstance(control, planes.ServerOwner):
            return None
        return lambda folder: log_folder_url(control.server, folder)

    # -- %dist ------------------------------------------------------------------------------
    @magic_arguments()
    @argument("command", help=f"one of: {', '.join(DIST_COMMANDS)}")
    @argument("names", nargs="*", help="variable names, for push and pull")
    @argument("--session", default=None, help="which session (default: the current one)")
    @argument("--ranks", default=None, help="only these ranks (push, pull, interrupt, stacks)")
    @argument(
        "--timeout",
        type=float,
        default=OBJECTS_TIMEOUT_S,
        help=f"push, pull: seconds to wait for the ranks (default: {OBJECTS_TIMEOUT_S:g})",
    )
    @argument(
        "--all",
        action="store_true",
        help="shutdown: every session (of this kernel, or of the Jupyter server that owns them)",
    )
    @argument(
        "--from",
        dest="source",
        type=_count(0, MAX_WORLD_SIZE - 1, "a rank"),
        default=None,
        help="sync: the rank copied from",
    )
    @argument(
        "--to",
        default=None,
        help="sync: the ranks copied to (default: those the last heal replaced, else every other)",
    )
    @argument(
        "--rank",
        type=_count(0, MAX_WORLD_SIZE - 1, "a rank"),
        default=None,
        help="debug: the rank whose last traceback is debugged (default: the root cause of "
        "the last failed cell)",
    )
    @argument("--spares", default=None, help="heal, resize: hosts a node may move to: h1,h2")
    @argument(
        "--nodes",
        type=_count(1, MAX_NODES, "a number of nodes"),
        default=None,
        help="resize: the number of nodes",
    )
    @argument("--procs", default=None, help="resize: ranks per node (CPU sessions)")
    @argument("--gpus", default=None, help="resize: ranks per node (GPU sessions)")
    @line_magic
    def dist(self, line: str) -> Any:
        """Manage sessions: status, stacks, attach NAME, shutdown, restart, interrupt,
        push NAMES, pull NAME.

        ``%dist stacks`` shows where every rank is (its Python stack, grouped: "ranks 0,1
        in all_reduce ..., cell line 4"), also while ranks hang in a collective.

        ``%dist attach NAME`` makes NAME this notebook's session (under a Jupyter server,
        any notebook can attach to any session the server runs).

        ``%dist pull x`` returns a list with one value per rank; ``%dist push a b``
        sends notebook variables to every rank (cloudpickle, arrays as binary buffers; to
        the ranks of this machine, large ones through shared memory that each rank maps
        copy-on-write, ``JUPYTER_DIST_SHARED_PUSH=off`` to send them by socket).
        """
        if not line.strip():
            print(dist_usage())
            return None
        args = parse_argstring(self.dist, line)
        if args.command not in DIST_COMMANDS:
            raise UsageError(f"%dist {args.command}: unknown command\n\n{dist_usage()}")
        try:
            return getattr(self, f"_dist_{args.command}")(args)
        except SpecError as err:
            raise UsageError(str(err)) from None

    def _ranks_arg(self, args: Any, session: RankGroup) -> list[int] | None:
        return list(parse_ranks(args.ranks, session.spec.world_size)) if args.ranks else None

    def _dist_status(self, args: Any) -> None:
        from jupyter_dist.display.status_table import status_bundle

        manager = self.control.manager
        sessions = self.control.run(manager.list_status())
        owner = f"sessions run in {manager.where}"
        if planes.fallback_reason:
            owner += f": {planes.fallback_reason}"
        if sessions:
            headline = f"{owner}; this notebook's session: {self._name(None)!r}"
        else:
            headline = f"no jupyter_dist sessions are running ({owner})"
        where = "this kernel" if isinstance(self.control, planes.EmbeddedOwner) else "server"
        bundle = status_bundle(sessions, where, headline, _rank_memory(sessions))
        publish_display_data(bundle)

    def _dist_shutdown(self, args: Any) -> None:
        manager = self.control.manager
        if args.all:
            self.control.run(manager.shutdown_all())
            self._current = ""
            print("[jupyter_dist] every session shut down")
            return
        name = self._name(args.session)
        self.control.run(manager.shutdown(name))
        if name == self._last_used():
            self._current = ""  # the next cell goes to this notebook's own session
        print(f"[jupyter_dist] session {name!r} shut down")

    def _dist_restart(self, args: Any) -> None:
        name = self._name(args.session)
        manager = self.control.manager

        async def restart(sink: queue.SimpleQueue[CellEvent]) -> RankGroup:
            return await manager.restart(name, lambda text: sink.put(Notice(text)))

        session: RankGroup = self._call(restart)
        print(f"[jupyter_dist] session {name!r} restarted: {session.spec.describe()}")

    def _dist_stacks(self, args: Any) -> None:
        from jupyter_dist.common import stacks

        session = self._session(args.session)
        dumps = self.control.run(session.stacks(self._ranks_arg(args, session)))
        print(f"[jupyter_dist] where the ranks of session {session.name!r} are:")
        print(stacks.describe(dumps))

    def _dist_attach(self, args: Any) -> None:
        if len(args.names) != 1:
            raise SpecError(
                f"%dist attach: expected one session name, got {len(args.names)}; "
                "`%dist status` lists them"
            )
        name = check_session_name(args.names[0])
        manager = self.control.manager
        session = self.control.run(manager.find(name, use=True))
        self._current = self._announced = name
        print(
            f"[jupyter_dist] attached to session {name!r} ({session.spec.describe()}, "
            f"{session.state.value}) in {manager.where}; %%distributed cells "
            "without --session run there"
        )
        owner = manager.belongs_to(name)
        if owner:
            self._told_whose.add(name)
            print(f"[jupyter_dist] {whose_words(name, owner)}")

    def _dist_interrupt(self, args: Any) -> None:
        """Whoever sent the running cell: under a server, every notebook attached to the
        session is told who interrupted it; this cell says what was interrupted."""
        session = self._session(args.session)
        ranks = self._ranks_arg(args, session)
        manager = self.control.manager
        before = next(
            (s for s in self.control.run(manager.list_status()) if s["name"] == session.name),
            None,
        )
        self.control.run(manager.interrupt(session.name, ranks))
        print(f"[jupyter_dist] {interrupt_words(session.name, before, ranks)}")

    def _dist_push(self, args: Any) -> None:
        if not args.names:
            raise SpecError("%dist push: expected variable names, e.g. %dist push model data")
        check_seconds("--timeout", args.timeout)
        session = self._session(args.session)
        names = parse_names(",".join(args.names))
        payload = pickling.dump(self._user_values(names))
        self.control.run(
            session.push(payload, self._ranks_arg(args, session), args.timeout, _SaidOnce())
        )

    def _dist_heal(self, args: Any) -> None:
        name = self._name(args.session)
        spares = parse_hosts(args.spares, "--spares") if args.spares else ()
        manager = self.control.manager

        async def heal(sink: queue.SimpleQueue[CellEvent]) -> str:
            return await manager.heal(
                name, spares=spares, progress=lambda text: sink.put(Notice(text))
            )

        said: str = self._call(heal)
        print(f"[jupyter_dist] {said}")

    def _dist_resize(self, args: Any) -> None:
        name = self._name(args.session)
        session = self._session(args.session)
        spares = parse_hosts(args.spares, "--spares") if args.spares else ()
        given = args.gpus if session.spec.device == "cuda" else args.procs
        flag = "--gpus" if session.spec.device == "cuda" else "--procs"
        nodes = args.nodes if args.nodes is not None else session.spec.nodes
        if args.nodes is None and given is None:
            raise SpecError(f"%dist resize: expected --nodes N or {flag} P")
        check_node_count(nodes, "--nodes")
        if given is not None:
            counts = parse_counts(flag, given)
            if len(counts) == 1:
                counts = counts * nodes
        else:
            old = session.spec.counts
            counts = tuple(old[n] if n < len(old) else old[-1] for n in range(nodes))
        if len(counts) != nodes:
            raise SpecError(f"{flag} {given}: {len(counts)} counts for {nodes} nodes")
        manager = self.control.manager

        async def resize(sink: queue.SimpleQueue[CellEvent]) -> str:
            return await manager.resize(
                name, counts, spares, progress=lambda text: sink.put(Notice(text))
            )

        said: str = self._call(resize)
        print(f"[jupyter_dist] {said}")

    def _dist_sync(self, args: Any) -> None:
        if not args.names:
            raise SpecError(
                "%dist sync: expected variable names, e.g. %dist sync model,opt --from 0"
            )
        if args.source is None:
            raise SpecError("%dist sync: expected --from RANK, the rank that has the variables")
        names = parse_names(",".join(args.names), "%dist sync")
        session = self._session(args.session)
        (source,) = session.check_ranks([args.source])
        replaced = [r for r in session.recovery.replaced if r != source and r in session.ranks]
        if args.to:
            targets = [r for r in parse_ranks(args.to, session.spec.world_size) if r != source]
        else:  # the ranks the last heal started empty, else every other
            targets = replaced or [r for r in sorted(session.ranks) if r != source]
        if not targets:
            raise SpecError(f"%dist sync: no rank to copy to besides rank {source}")
        code = (
            "import jupyter_dist.rank.state_sync as _jd_sync\n"
            f"_jd_sync.sync({names!r}, {source}, {targets!r})\n"
            "del _jd_sync\n"
        )
        result = self.control.run(session.execute(code, [source, *targets], _SaidOnce()))
        session.raise_for(result)
        print(
            f"[jupyter_dist] {', '.join(names)} copied from rank {source} to "
            f"{ranks_label(targets)} over the process group"
        )

    def _dist_profiles(self, args: Any) -> None:
        """Every profile: its name, launcher and fields, and the file; where the file goes
        when there is none."""
        from jupyter_dist.common.profiles import (
            described,
            example,
            launcher_words,
            options_of,
            profiles_path,
            read_profiles,
        )

        path = profiles_path()
        profiles = read_profiles(path)
        if not profiles:
            print(f"[jupyter_dist] {example(path)}")
            return
        known = options_of(self.distributed.parser)
        width = max(map(len, profiles))
        print(f"[jupyter_dist] profiles in {path} (%%distributed --profile NAME):")
        for name, profile in profiles.items():
            try:
                profile.check_fields(known)
                wrong = ""
            except SpecError as err:
                wrong = f"  !! {str(err).removeprefix(profile.where() + ', ')}"
            launcher = launcher_words(profile.launcher)
            print(f"  {name:<{width}}  {launcher:<10}  {described(profile.settings)}{wrong}")

    def _dist_debug(self, args: Any) -> None:
        """pdb on a rank's last traceback (IPython's ``%debug`` run there), its prompts
        in the notebook's input box (`notebook.input_desk`)."""
        session = self._session(args.session)
        rank = args.rank if args.rank is not None else session.debuggable_rank
        if rank is None:
            raise SpecError(
                f"%dist debug: no cell of this notebook has failed on a rank of session "
                f"{session.name!r} yet; give the rank to debug with --rank N"
            )
        chosen = session.check_ranks([rank])
        print(f"[jupyter_dist] debugging rank {rank}'s last traceback; q leaves the debugger")
        sink: queue.SimpleQueue[CellEvent] = EventQueue()
        run_cell(self.control, session, "%debug", chosen, None, _renderer(chosen), sink)

    def _dist_pull(self, args: Any) -> list[Any]:
        if len(args.names) != 1:
            raise SpecError(f"%dist pull: expected one variable name, got {len(args.names)}")
        (name,) = parse_names(args.names[0], "%dist pull")
        check_seconds("--timeout", args.timeout)
        session = self._session(args.session)
        values: list[Any] = self.control.run(
            session.pull(name, self._ranks_arg(args, session), args.timeout, _SaidOnce())
        )
        return values


def dist_usage() -> str:
    """What ``%dist`` alone prints: each command, a line each."""
    width = max(map(len, DIST_HELP))
    rows = "\n".join(f"  %dist {usage:<{width}}  {what}" for usage, what in DIST_HELP.items())
    return (
        "usage: %dist COMMAND [--session NAME] [--ranks 0,2-3] ...\n\n"
        f"commands:\n{rows}\n\n"
        "Without --session, a command acts on this notebook's session. "
        "%dist? shows every option."
    )


class _SaidOnce(queue.SimpleQueue[CellEvent]):
    """A sink that prints each new kind of notice once (``waiting for a cell from
    train.ipynb``), for a `%dist` command that waits for another notebook's cell."""

    def __init__(self) -> None:
        self.said: set[str] = set()

    def put(self, item: CellEvent, block: bool = True, timeout: float | None = None) -> None:
        if isinstance(item, Notice):
            gist = re.sub(r"\d+", "#", item.text)
            if gist not in self.said:
                self.said.add(gist)
                print(f"[jupyter_dist] {item.text}", flush=True)


def _rank_memory(sessions: list[SessionStatus]) -> dict[str, dict[int, float]]:
    """RSS in MiB of the ranks this machine can see: a rank process here whose parent is
    its node's agent (a remote rank's pid means nothing here)."""
    import psutil

    memory: dict[str, dict[int, float]] = {}
    for s in sessions:
        agents = {n["node_rank"]: n["agent_pid"] for n in s["nodes"]}
        for r in s["ranks"]:
            pid, agent = r["pid"], agents.get(r["node_rank"])
            if not pid or not agent:
                continue
            try:
                proc = psutil.Process(pid)
                if proc.ppid() == agent:
                    memory.setdefault(s["name"], {})[r["rank"]] = proc.memory_info().rss / 2**20
            except psutil.Error:
                continue
    return memory
