"""Start an IPython kernel in a freshly forked rank process.

Rank kernels are ordinary ipykernel kernels; only a few settings differ from a notebook's
kernel: history stays in memory (many ranks must not fight over one SQLite file), the
banner and start-up chatter are off, and what every cell would pay for nobody is left out
(the sleep before a reply, debug log records, the notebook side's own cells echoed back,
empty flushes, a thread hand-off of each request, a signature check of ``run_cell_async``
each cell, a copy of everything printed: see `RankShell`, `RankKernel`, `RankKernelApp`,
`run_rank_kernel` and `rank.out_stream`). To libraries the shell is a notebook kernel's.
The notebook side's cells are answered with one IOPub message (`rank.iopub_reply`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import IO, Any

import zmq
from ipykernel.ipkernel import IPythonKernel
from ipykernel.kernelapp import IPKernelApp
from ipykernel.zmqshell import ZMQInteractiveShell
from traitlets import Float, Type

from jupyter_dist.common.agent_protocol import STACKS_SIGNAL
from jupyter_dist.common.wire_names import (
    CREDIT_KEY,
    GROUP_KEY,
    NOTEBOOK_COUNT_KEY,
)
from jupyter_dist.rank import (
    child_reaper,
    console_guard,
    group_renewal,
    group_sockets,
    interrupt_ack,
    output_log,
    rank_input,
    stack_dumps,
)
from jupyter_dist.rank.iopub_credit import SEND_QUEUE, CreditGate, take_ack
from jupyter_dist.rank.iopub_reply import IopubReplies, iopub_reply_request
from jupyter_dist.rank.out_stream import attribute_threads
from jupyter_dist.rank.superseded_updates import Superseded
from jupyter_dist.text import strip_ansi

RANK_KERNEL_ARGS = (
    "--HistoryManager.hist_file=:memory:",
    "--IPKernelApp.quiet=True",
    # bounded messages, and a writer that waits instead of growing a queue
    "--IPKernelApp.outstream_class=jupyter_dist.rank.out_stream.RankOutStream",
)

_crash_log: IO[str] | None = None
#: paces each credited cell's IOPub messages by its sender (`rank.iopub_credit`)
CREDIT = CreditGate()
#: the rank's scheduler of IOPub sends, which skips superseded widget updates, once its
#: IO thread is made (`rank.superseded_updates`)
SUPERSEDED: Superseded | None = None


class RankShell(ZMQInteractiveShell):
    """The rank's IPython shell, which keeps no copy of what its cells print.

    IPython 9 wraps ``sys.stdout.write`` and ``sys.stderr.write`` around every cell and
    appends each piece written to the history's ``outputs``, which only ``reset``
    clears: a rank printing a training loop's losses for hours would hold every line it
    ever printed, two pieces a ``print`` with an object's overhead each (300,000 lines
    like ``step 1234 loss 0.001234``: 32 MB a rank, a gigabyte for ten million), and
    each ``print`` pays for the wrapper. The notebook side keeps a rank's output
    already, in the cell's view and in the rank's log files, so the rank keeps none
    (``%history -o`` on a rank lists no printed output; results shown as ``Out[N]`` are
    kept as before)."""

    def _get_exc_info(self, exc_tuple: Any = None) -> Any:
        """IPython's, with an interrupt's traceback ending on the user's line, not in the
        handler that acknowledged it (`rank.interrupt_ack.without_handler`), and without
        the error of a collective it was freed from (`rank.group_sockets`)."""
        etype, value, tb = super()._get_exc_info(exc_tuple)
        if etype is KeyboardInterrupt:
            tb = interrupt_ack.without_handler(tb)
            if value is not None:
                value.__traceback__ = tb
                group_sockets.hide_freed_error(value)
        return etype, value, tb

    @contextlib.contextmanager
    def _tee(self, *args: Any, **kwargs: Any) -> Iterator[None]:
        del args, kwargs
        yield

    def init_prompts(self) -> None:
        """Set no ``sys.ps1``: a rank is a launched worker process, not a console.

        IPython sets the prompts "so that scripts can decide if they are running
        interactively", and libraries do decide by them: PyTorch Lightning reads
        ``hasattr(sys, "ps1")`` once, when imported, and then refuses
        ``Trainer(strategy="ddp")`` ("not compatible with an interactive environment")
        and turns ``"auto"`` with several devices into forking its own workers. A rank
        runs what a torchrun worker runs, in torchrun's environment, so it answers that
        question as a torchrun worker does (the notebook's own kernel keeps its prompts).
        """
        for name in ("ps1", "ps2", "ps3"):
            if hasattr(sys, name):
                delattr(sys, name)

    def init_environment(self) -> None:
        """ipykernel's environment, but not a terminal that can move its cursor.

        ipykernel sets ``FORCE_COLOR=1`` so that tools print in colour, and rich takes
        that for a terminal where it does not see a notebook kernel (a process the cell
        starts, which inherits the environment): its live displays then redraw themselves
        with cursor movements that a cell's output, the all-ranks view and the rank's log
        show as frame after frame of escape codes. ``TTY_COMPATIBLE=0`` (rich's own
        switch) makes rich write what it writes to a file: the finished display, once. In
        the rank itself rich sees a notebook kernel (`RankShell`'s name) and redraws in
        place. Colour for other tools is kept; a value the notebook's environment gives is
        kept too."""
        super().init_environment()
        os.environ.setdefault("TTY_COMPATIBLE", "0")


#: Libraries tell a notebook kernel from a terminal by the name of the shell's class
#: (rich's console, huggingface_hub's ``is_notebook``): a rank's output is shown in a
#: notebook, so its shell answers to a notebook kernel's name. rich then draws its live
#: displays (Lightning's default progress bar) in an Output widget, redrawn in place,
#: which the notebook side fills (`display.output_widgets`), instead of once at the end.
RankShell.__name__ = ZMQInteractiveShell.__name__


class RankKernel(IPythonKernel):
    """`IPythonKernel` that runs a cell under the notebook's execution count when the
    request carries it (`NOTEBOOK_COUNT_KEY` in its metadata), so that a rank's traceback
    says ``Cell In[N]`` for the N the notebook shows beside the cell, and does not echo
    the notebook side's cells on IOPub. Its shell is a `RankShell`. The input of any
    other client (a console on the rank) is refused unrun when it calls a collective
    (`rank.console_guard`)."""

    shell_class = Type(RankShell)

    #: ipykernel sleeps this long between flushing a cell's output and sending its reply,
    #: so that a frontend reading both sockets sees the output first; the notebook side
    #: here waits for a rank's idle status as well as its reply, in either order, and the
    #: sleep would only add half a millisecond to every cell of every rank
    _execute_sleep = Float(0.0)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        shell = self.shell
        if shell is not None and hasattr(shell, "_showtraceback"):
            shown = shell._showtraceback

            def showtraceback(etype: Any, evalue: Any, stb: list[str]) -> None:
                log_traceback(stb)
                shown(etype, evalue, stb)

            shell._showtraceback = showtraceback
        if shell is not None:
            _keep_rich_output(shell)
        self._iopub_replies: IopubReplies | None = None
        rank_input.use_python_hook()

    def _input_request(self, prompt: str, ident: Any, parent: Any, password: bool = False) -> str:
        """ipykernel's, addressed to the identity behind the node's relay
        (`rank.rank_input.reply_to`); an interrupt while a debugger waits for its next
        command ends the debugging session (`rank.rank_input.quit_debugger`)."""
        try:
            rank_input.announce(self, str(prompt), bool(password))
            return str(super()._input_request(prompt, rank_input.reply_to(ident), parent, password))
        except KeyboardInterrupt:
            rank_input.quit_debugger()
            raise

    def pre_handler_hook(self) -> None:
        """SIGINT raises ``KeyboardInterrupt`` during a request, as ipykernel has it, and
        says so at once on IOPub (`rank.interrupt_ack`)."""
        self.saved_sigint_handler = interrupt_ack.install(self)

    def _send_interrupt_children(self) -> None:
        """An interrupt: SIGINT to the rank's process group, as ipykernel sends it, then
        what the cell started and did not stop is ended (`rank.child_reaper`)."""
        super()._send_interrupt_children()
        child_reaper.after_interrupt()

    async def dispatch_shell(
        self, msg: Any, /, subshell_id: str | None = None, *, concurrent: bool = False
    ) -> None:
        """The notebook side's cells take the short way (`rank.iopub_reply`); every
        other request, ipykernel's."""
        if subshell_id is None and not concurrent and self.session is not None:
            request = iopub_reply_request(msg)
            if request is not None:
                if self._iopub_replies is None:
                    self._iopub_replies = IopubReplies(self)
                if await self._iopub_replies.run(*request):
                    return
        await super().dispatch_shell(msg, subshell_id, concurrent=concurrent)

    def _publish_execute_input(self, code: str, parent: Any, execution_count: int) -> None:
        """Echo a cell's code on IOPub, except for the notebook side's own cells: it has
        the code already and reads no echo, and at hundreds of ranks the echo would be a
        quarter of the messages a cell costs the notebook. Other clients (a console on
        the rank) get their echo as usual."""
        if ((parent or {}).get("metadata") or {}).get(CREDIT_KEY):
            return
        super()._publish_execute_input(code, parent, execution_count)

    async def dispatch_control(self, msg: Any) -> None:
        """A sender's acknowledgement of its cell's output is taken at once, on the
        control thread, without a status or a flush (`rank.iopub_credit`: the flush would
        wait for the IO thread, which may be waiting for this acknowledgement); every
        other control request, as ipykernel handles it."""
        if self.session is not None and take_ack(CREDIT, self.session, msg):
            return
        await super().dispatch_control(msg)

    async def do_execute(
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict[str, Any] | None = None,
        allow_stdin: bool = False,
        *,
        cell_meta: dict[str, Any] | None = None,
        cell_id: str | None = None,
    ) -> Any:
        if (cell_meta or {}).get(CREDIT_KEY):
            msg_id = self.get_parent("shell").get("header", {}).get("msg_id")
            if isinstance(msg_id, str):
                CREDIT.credit(msg_id)
        elif not silent and self.shell is not None:
            refused = console_guard.refusal(
                code, os.environ.get("RANK", "?"), os.environ.get("WORLD_SIZE", "?")
            )
            if refused is not None:
                return self._refuse(refused)
        count = (cell_meta or {}).get(NOTEBOOK_COUNT_KEY)
        if isinstance(count, int) and count > 0 and not silent and self.shell is not None:
            self.shell.execution_count = count
        kept = output_log.current
        if kept is not None and not silent:
            kept.cell(self.shell.execution_count if self.shell is not None else None)
        reply = await super().do_execute(
            code,
            silent,
            store_history,
            user_expressions,
            allow_stdin,
            cell_meta=cell_meta,
            cell_id=cell_id,
        )
        if isinstance(reply, dict):  # the session's status tells the group as it is
            reply[GROUP_KEY] = group_renewal.describe()
        return reply

    def _refuse(self, why: str) -> dict[str, Any]:
        """An error reply for a console's input that is not run (`rank.console_guard`),
        shown in the console and written to the rank's log as a traceback is."""
        assert self.shell is not None
        error = console_guard.CollectiveInConsole
        name = error.__name__
        stb = [f"{name}: {why}"]
        self.shell._showtraceback(error, why, stb)
        return {
            "status": "error",
            "execution_count": self.shell.execution_count,
            "ename": name,
            "evalue": why,
            "traceback": stb,
        }


class RankKernelApp(IPKernelApp):
    """`IPKernelApp` whose IOPub socket drops, for a subscriber whose queue holds
    `SEND_QUEUE` messages, what it cannot take, while each credited cell's messages go
    at the pace of that cell's sender (`rank.iopub_credit`): a stopped notebook can stall
    neither the ranks nor the other notebooks.

    The queue bound is set as the socket is made, before the IOPub thread that owns it
    starts: a zmq socket must not be touched by two threads, and the notebook may already
    be subscribing while the kernel initialises.
    """

    kernel_class = Type(RankKernel, klass=IPythonKernel)

    def init_sockets(self) -> None:
        """The kernel's main thread reads its shell socket itself. ipykernel 7 reads it in
        a thread of its own and hands each request over to the main thread (for subshells,
        run beside a busy cell); no client of a rank asks for a subshell, and the
        hand-off is two more thread switches a request on every rank."""
        super().init_sockets()
        self.shell_channel_thread = None

    def init_iopub(self, context: zmq.Context[Any]) -> None:
        # the context's default options go to each socket it makes from now on
        context.setsockopt(zmq.SNDHWM, SEND_QUEUE)
        try:
            super().init_iopub(context)
        finally:
            del context.sockopts[zmq.SNDHWM]
        thread = self.iopub_thread
        send = thread._really_send

        def paced_send(msg: list[Any], *args: Any, **kwargs: Any) -> None:
            CREDIT.before_send(msg)
            send(msg, *args, **kwargs)

        thread._really_send = paced_send
        # a widget's update that a later one replaces is not sent while it waits
        global SUPERSEDED
        superseded = SUPERSEDED = Superseded(thread.schedule)

        def send_multipart(msg: list[Any], *args: Any, **kwargs: Any) -> None:
            superseded.schedule(msg, lambda: paced_send(msg, *args, **kwargs))

        thread.send_multipart = send_multipart


def _cache_signature_checks() -> None:
    """ipykernel asks `inspect.signature` of the shell's ``run_cell_async`` on every
    cell, whether it takes ``cell_id`` and ``cell_meta`` (a tenth of a rank's time on a
    short cell); the answer changes only with the function, so it is kept by function."""
    from ipykernel import ipkernel

    check = getattr(ipkernel, "_accepts_parameters", None)
    if check is None or getattr(check, "cached", False):
        return
    answers: dict[tuple[Any, tuple[str, ...]], dict[str, bool]] = {}

    def cached(meth: Any, param_names: list[str]) -> dict[str, bool]:
        key = (getattr(meth, "__func__", meth), tuple(param_names))
        answer = answers.get(key)
        if answer is None:
            answer = answers[key] = check(meth, param_names)
        return dict(answer)

    cached.cached = True  # type: ignore[attr-defined]
    setattr(ipkernel, "_accepts_parameters", cached)  # noqa: B010 - a private name


def log_traceback(stb: list[str]) -> None:
    """A traceback the rank shows (the ``error`` message ipykernel publishes) goes to its
    output log too (`rank.output_log`): a rank that only raised has its traceback there,
    as does a crash under ``%run`` or a traceback a library shows."""
    kept = output_log.current
    if kept is not None:
        kept.write(strip_ansi("\n".join(stb)).rstrip("\n") + "\n")


def _plain(data: Any) -> str:
    text = data.get("text/plain") if isinstance(data, dict) else None
    return text.rstrip("\n") + "\n" if isinstance(text, str) and text else ""


def _keep_rich_output(shell: Any) -> None:
    """Rich output (``display(...)``, a cell's ``Out[N]``) goes to the output log as its
    plain text, beside what ipykernel publishes."""
    pub = getattr(shell, "display_pub", None)
    if pub is not None and hasattr(pub, "publish"):
        publish = pub.publish

        def kept_publish(data: Any, *args: Any, **kwargs: Any) -> Any:
            if output_log.current is not None:
                output_log.current.write(_plain(data))
            return publish(data, *args, **kwargs)

        pub.publish = kept_publish
    hook = getattr(shell, "displayhook", None)
    if hook is not None and hasattr(hook, "write_format_data"):
        write_format_data = hook.write_format_data

        def kept_result(format_dict: Any, *args: Any, **kwargs: Any) -> Any:
            text = _plain(format_dict)
            if output_log.current is not None and text:
                count = getattr(shell, "execution_count", "")
                output_log.current.write(f"Out[{count}]: {text}")
            return write_format_data(format_dict, *args, **kwargs)

        hook.write_format_data = kept_result


def _write_log(text: str) -> None:
    if _crash_log is not None:
        _crash_log.write(text)
        _crash_log.flush()


def run_rank_kernel(
    connection_file: str,
    agent_pid: int,
    log_fd: int,
    stacks_fd: int | None = None,
    output_base: str | None = None,
) -> None:
    """Initialise and run the kernel until it is shut down.

    ``output_base`` names the rank's output log (`rank.output_log`): what its cells show.
    ``log_fd`` is the rank's process log (its diagnostics). ipykernel swaps fds 1 and 2
    for pipes it forwards to the notebook, and those die with the process; so a fatal
    error (segfault, abort) is dumped by faulthandler straight into the log, where the
    agent reads it back. A byte on ``stacks_fd`` asks for every thread's stack in the log
    (`rank.stack_dumps`).
    """
    global _crash_log
    import faulthandler

    _crash_log = os.fdopen(log_fd, "w", buffering=1)
    if output_base is not None:
        output_log.open_log(output_base)
    faulthandler.enable(file=_crash_log, all_threads=False)
    # `%dist stacks`: a dump of every thread on demand, even with the main thread stuck
    # in a C++ collective: written by a thread of the rank when the agent asks on the
    # pipe; faulthandler's signal is the agent's fallback for a rank whose GIL is held
    if stacks_fd is not None:
        stack_dumps.start(stacks_fd, _write_log)
    faulthandler.register(STACKS_SIGNAL, file=_crash_log, all_threads=True, chain=False)

    # what a fresh interpreter's code sees (``%run script.py args`` sets its own for the
    # script's run), not the agent's command line, which argparse would try to parse
    sys.argv[:] = [""]
    attribute_threads()
    _cache_signature_checks()
    app = RankKernelApp.instance()
    # the kernel's Unix sockets are made while it initialises: owner-only (0700) on top of
    # their private folder; the user's own files keep the user's umask
    umask = os.umask(0o077)
    try:
        # parent_handle: ipykernel exits when the agent does (its default is read from the
        # environment at import time, which happened in the agent, not here)
        app.initialize(
            ["-f", connection_file, f"--IPKernelApp.parent_handle={agent_pid}", *RANK_KERNEL_ARGS]
        )
    finally:
        os.umask(umask)
    # traitlets keeps an app's logger at DEBUG and filters in its handler, so every
    # ``log.debug`` of ipykernel's message loop builds a record that is then thrown away
    # (a tenth of a rank's time on a short cell); the logger itself filters here
    app.log.setLevel(app.log_level)
    app.start()
