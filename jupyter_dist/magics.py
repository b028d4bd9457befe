"""``%%distributed`` and ``%dist``: parse the arguments, then delegate.

``%%distributed?`` and ``%dist?`` print the argparse manual generated from the
decorators below.
"""

from __future__ import annotations

import ast
import os
import queue
import sys
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import publish_display_data

from jupyter_dist import objects
from jupyter_dist.cell_driver import run_cell, wait_with_notices
from jupyter_dist.cluster_env import detect_skypilot
from jupyter_dist.errors import DistError, SpecError
from jupyter_dist.events import CellEvent, Notice
from jupyter_dist.hosts import parse_hosts, read_hostfile
from jupyter_dist.inprocess import InProcessControl, control
from jupyter_dist.render_text import TextRenderer
from jupyter_dist.session import Session, SessionState
from jupyter_dist.spec import (
    DEFAULT_SESSION,
    ShapeRequest,
    check_same_shape,
    check_session_name,
    parse_counts,
    parse_names,
    parse_ranks,
)

DIST_COMMANDS = ("status", "shutdown", "restart", "interrupt", "push", "pull")


def _display(data: dict[str, Any], metadata: dict[str, Any]) -> None:
    publish_display_data(data=data, metadata=metadata)


def _renderer(ranks: list[int]) -> TextRenderer:
    return TextRenderer(ranks, sys.stdout, sys.stderr, _display)


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


@magics_class
class DistMagics(Magics):
    """The jupyter_dist magics."""

    def __init__(self, shell: Any, control_plane: InProcessControl | None = None) -> None:
        super().__init__(shell)
        self._control = control_plane

    @property
    def control(self) -> InProcessControl:
        if self._control is None:
            self._control = control()
        return self._control

    # -- helpers ------------------------------------------------------------------------
    def _call(self, make: Callable[[queue.SimpleQueue[CellEvent]], Any]) -> Any:
        """Run a control-plane coroutine, drawing its progress notices as they come."""
        sink: queue.SimpleQueue[CellEvent] = queue.SimpleQueue()
        future = self.control.loop.submit(make(sink))
        return wait_with_notices(future, sink, _renderer([]))

    def _session(self, name: str) -> Session:
        return self.control.manager.get(check_session_name(name))

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
        "--nodes",
        type=int,
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
        help="the Python on the nodes (default: the notebook's path if the node has "
        "it, else python3)",
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
        help="CPU ranks per node, gloo backend; one count, or one per node like 2,1",
    )
    @argument("--backend", default=None, help="process group backend: nccl or gloo")
    @argument("--ranks", default=None, help="run on these ranks only, e.g. 0,2-3")
    @argument(
        "--session",
        default=DEFAULT_SESSION,
        help="session name; several sessions can run side by side",
    )
    @argument("--push", default=None, help="notebook variables to send to the ranks first: a,b")
    @argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds before the ranks are interrupted and the cell fails",
    )
    @argument(
        "--no-init", action="store_true", help="do not create the torch.distributed process group"
    )
    @cell_magic
    def distributed(self, line: str, cell: str) -> None:
        """Run the cell on every rank of a session (started on first use).

        The first cell of a session chooses its shape, e.g. ``--procs 2`` (CPU, gloo) or
        ``--gpus 4`` (one rank per CUDA device, nccl); later cells reuse the running ranks
        and their variables. Each rank sees torchrun's environment (RANK, LOCAL_RANK,
        WORLD_SIZE, MASTER_ADDR, ...) with the default process group initialised.
        Output comes back prefixed ``[rank N]``; identical lines are shown once.
        """
        args = parse_argstring(self.distributed, line)
        try:
            self._distributed(args, cell)
        except DistError as err:
            if isinstance(err, SpecError):
                raise UsageError(str(err)) from None
            raise

    def _distributed(self, args: Any, cell: str) -> None:
        name = check_session_name(args.session)
        if args.timeout is not None and args.timeout <= 0:
            raise SpecError(f"--timeout {args.timeout}: expected a positive number of seconds")
        if args.hosts and args.hostfile:
            raise SpecError("--hosts and --hostfile: give one of them")
        hosts = (
            parse_hosts(args.hosts)
            if args.hosts
            else read_hostfile(args.hostfile)
            if args.hostfile
            else ()
        )
        gpus = parse_counts("--gpus", args.gpus) if args.gpus else None
        procs = parse_counts("--procs", args.procs) if args.procs else None
        detected = detect_skypilot(os.environ) if not hosts and args.nodes != 1 else None
        if detected is not None and name not in self.control.manager.sessions:
            hosts = detected.hosts
            if gpus is None and procs is None and detected.gpus_per_node:
                gpus = (detected.gpus_per_node,)
            print(
                f"[jupyter_dist] using the {detected.source} cluster: "
                f"{len(hosts)} nodes ({', '.join(str(h) for h in hosts)}); --nodes 1 for "
                "this machine only"
            )
        request = ShapeRequest(
            nodes=args.nodes,
            gpus=gpus,
            procs=procs,
            backend=args.backend,
            init=False if args.no_init else None,
            hosts=hosts,
            python=args.python,
            ssh_config=args.ssh_config,
        )
        _check_syntax(self.shell, cell)
        ranks = parse_ranks(args.ranks) if args.ranks else None
        payload = objects.dump(self._user_values(parse_names(args.push))) if args.push else None

        manager = self.control.manager

        async def start(sink: queue.SimpleQueue[CellEvent]) -> Session:
            session, started = await manager.get_or_start(
                name, request, lambda text: sink.put(Notice(text))
            )
            if started:
                sink.put(Notice(f"session {name!r} ready: {session.spec.describe()}"))
            return session

        running = manager.sessions.get(name)
        if running is not None and running.state != SessionState.STOPPED:
            check_same_shape(running.spec, request)  # the common case: no loop round trip
            session = running
        else:
            session = self._call(start)
        chosen = session.check_ranks(ranks)
        if payload is not None:
            self.control.run(session.push(payload, chosen))
        sink: queue.SimpleQueue[CellEvent] = queue.SimpleQueue()
        run_cell(self.control, session, cell, chosen, args.timeout, _renderer(chosen), sink)

    # -- %dist ------------------------------------------------------------------------------
    @magic_arguments()
    @argument("command", help=f"one of: {', '.join(DIST_COMMANDS)}")
    @argument("names", nargs="*", help="variable names, for push and pull")
    @argument("--session", default=DEFAULT_SESSION, help="which session")
    @argument("--ranks", default=None, help="only these ranks (push, pull, interrupt)")
    @argument("--all", action="store_true", help="shutdown: every session of this kernel")
    @line_magic
    def dist(self, line: str) -> Any:
        """Manage sessions: status, shutdown, restart, interrupt, push NAMES, pull NAME.

        ``%dist pull x`` returns a list with one value per rank; ``%dist push a b``
        sends notebook variables to every rank (cloudpickle, binary buffers).
        """
        args = parse_argstring(self.dist, line)
        if args.command not in DIST_COMMANDS:
            raise UsageError(
                f"%dist {args.command}: unknown command; expected one of {', '.join(DIST_COMMANDS)}"
            )
        try:
            return getattr(self, f"_dist_{args.command}")(args)
        except SpecError as err:
            raise UsageError(str(err)) from None

    def _ranks_arg(self, args: Any, session: Session) -> list[int] | None:
        return list(parse_ranks(args.ranks, session.spec.world_size)) if args.ranks else None

    def _dist_status(self, args: Any) -> None:
        sessions = self.control.manager.status()
        if not sessions:
            print("no jupyter_dist sessions are running")
            return
        for s in sessions:
            master = f", master {s['master']}" if s["master"] else ""
            print(
                f"session {s['name']!r}: {s['state']}, {s['shape']}{master}, "
                f"{s['cells_run']} cells run"
            )
            if s["broken_reason"]:
                print(f"  lost {s['broken_reason']}")
            for r in s["ranks"]:
                exit_note = f" ({r['exit']})" if r["exit"] else ""
                print(
                    f"  rank {r['rank']}: {r['state']}{exit_note}, host {r['host']}, "
                    f"local rank {r['local_rank']}, pid {r['pid']}"
                )

    def _dist_shutdown(self, args: Any) -> None:
        manager = self.control.manager
        if args.all:
            self.control.run(manager.shutdown_all())
            print("[jupyter_dist] every session shut down")
            return
        name = check_session_name(args.session)
        manager.get(name)
        self.control.run(manager.shutdown(name))
        print(f"[jupyter_dist] session {name!r} shut down")

    def _dist_restart(self, args: Any) -> None:
        session = self._session(args.session)

        async def restart(sink: queue.SimpleQueue[CellEvent]) -> None:
            await session.restart(lambda text: sink.put(Notice(text)))

        self._call(restart)
        print(f"[jupyter_dist] session {session.name!r} restarted: {session.spec.describe()}")

    def _dist_interrupt(self, args: Any) -> None:
        session = self._session(args.session)
        self.control.run(session.interrupt(self._ranks_arg(args, session)))

    def _dist_push(self, args: Any) -> None:
        if not args.names:
            raise SpecError("%dist push: expected variable names, e.g. %dist push model data")
        session = self._session(args.session)
        names = parse_names(",".join(args.names))
        payload = objects.dump(self._user_values(names))
        self.control.run(session.push(payload, self._ranks_arg(args, session)))

    def _dist_pull(self, args: Any) -> list[Any]:
        if len(args.names) != 1:
            raise SpecError(f"%dist pull: expected one variable name, got {len(args.names)}")
        (name,) = parse_names(args.names[0], "%dist pull")
        session = self._session(args.session)
        values: list[Any] = self.control.run(session.pull(name, self._ranks_arg(args, session)))
        return values
