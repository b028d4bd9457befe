"""The jupyter-server extension: sessions owned by the server, not by one notebook kernel.

Enabled on install (``jupyter_server_config.d/jupyter_dist.json``). It runs the same
`SessionManager` the magic runs in-process, on the server's event loop, and stops every
session when the server stops, those still starting too (`SessionManager.close`).

It keeps a record of its sessions' processes in the Jupyter runtime folder
(`server.process_records`), and on start stops what a dead predecessor's sessions left running,
removes what they held on Ray clusters (`server.cluster_sweep`) and removes its rank consoles
(`server.rank_consoles`).
"""

from __future__ import annotations

import asyncio
import math
import threading
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_runtime_dir
from jupyter_server.extension.application import ExtensionApp
from tornado.ioloop import PeriodicCallback
from traitlets import Float, Int, TraitError, Unicode, validate

from jupyter_dist.common.hosts import check_ssh_config, parse_hosts
from jupyter_dist.common.payloads import ManagerEvent
from jupyter_dist.common.ports import parse_port_range
from jupyter_dist.control.limits import SessionLimits
from jupyter_dist.control.manager import SessionDefaults, SessionManager
from jupyter_dist.control.session import SessionTimeouts
from jupyter_dist.errors import SpecError
from jupyter_dist.server.cluster_sweep import sweep_clusters
from jupyter_dist.server.log_files import LOG_HANDLERS
from jupyter_dist.server.notebook_files import NotebookFiles
from jupyter_dist.server.notebook_kernels import prune
from jupyter_dist.server.process_records import (
    REAP_GRACE_S,
    Orphaned,
    SessionRecorder,
    find_orphaned,
    reap,
)
from jupyter_dist.server.rank_consoles import RankConsoles, reap_dead_folders
from jupyter_dist.server.rank_kernel_actions import RANK_KERNEL_HANDLERS
from jupyter_dist.server.routes import API_HANDLERS
from jupyter_dist.settings import MAX_RANKS_VAR

#: seconds between looks for notebook kernels that went away (`server.notebook_kernels`)
PRUNE_S = 10.0
#: the events jupyter_server's contents manager emits (a rename names both paths)
CONTENTS_EVENTS = "https://events.jupyter.org/jupyter_server/contents_service/v1"


class DistServerApp(ExtensionApp):
    """jupyter_dist inside a Jupyter server."""

    name = "jupyter_dist"
    load_other_extensions = True

    start_timeout = Float(
        120.0, config=True, help="Seconds for a node's agent and rank kernels to come up."
    )
    process_group_timeout = Float(
        300.0, config=True, help="Seconds init_process_group may wait for every rank."
    )
    ssh_config = Unicode(
        None, allow_none=True, config=True, help="ssh config file (default: ~/.ssh/config)."
    )
    default_hosts = Unicode(
        "",
        config=True,
        help="Nodes for sessions that name none, like --hosts: 'gpu1,gpu2' (a cell with "
        "--nodes 1 still runs on the server's machine; --nodes N takes the first N).",
    )
    master_port_range = Unicode(
        "",
        config=True,
        help="Ports MASTER_PORT may take, 'first-last' (default: any free port); for "
        "firewalls that open only a range between the nodes.",
    )
    reap_grace = Float(
        REAP_GRACE_S,
        config=True,
        help="Seconds the processes a dead server's sessions left running get between "
        "SIGTERM and SIGKILL, when a server starts and finds them.",
    )

    max_ranks_per_node = Int(
        0,
        config=True,
        help="The most ranks a session may start on one node; a request for more is refused "
        f"before anything starts. 0: {MAX_RANKS_VAR} if set, else twice this machine's CPU "
        "count (at least 8).",
    )
    max_sessions = Int(
        16,
        config=True,
        help="The most sessions this server runs at once, those still starting included; "
        "one more is refused (409) before anything of it starts. 0: no limit.",
    )
    max_ranks_per_node_all_sessions = Int(
        0,
        config=True,
        help="The most ranks all of this server's sessions together may run on one node "
        "(known by its host name; this machine's sessions and those naming localhost count "
        "together); a session that would pass it is refused (409) before anything of it "
        "starts. 0: no cap across sessions (each is held to max_ranks_per_node).",
    )

    _pruner: PeriodicCallback | None = None

    @validate("start_timeout", "process_group_timeout", "reap_grace")
    def _check_seconds(self, proposal: dict[str, Any]) -> float:
        value = float(proposal["value"])
        name = proposal["trait"].name
        if not math.isfinite(value) or value < 0 or (value == 0 and name != "reap_grace"):
            raise TraitError(f"{name} {value}: expected a finite positive number of seconds")
        return value

    @validate("max_ranks_per_node", "max_sessions", "max_ranks_per_node_all_sessions")
    def _check_max_ranks(self, proposal: dict[str, Any]) -> int:
        value = int(proposal["value"])
        name = proposal["trait"].name
        if value < 0:
            zero = "no limit" if name == "max_sessions" else "automatic"
            raise TraitError(f"{name} {value}: expected 0 ({zero}) or more")
        return value

    @validate("ssh_config")
    def _check_ssh_config(self, proposal: dict[str, Any]) -> str | None:
        value = proposal["value"]
        if value is not None:
            try:
                check_ssh_config(value, "ssh_config")
            except SpecError as err:
                raise TraitError(str(err)) from None
        return value if value is None else str(value)

    @validate("default_hosts")
    def _check_hosts(self, proposal: dict[str, Any]) -> str:
        value = str(proposal["value"])
        if value.strip():
            parse_hosts(value)
        return value

    @validate("master_port_range")
    def _check_ports(self, proposal: dict[str, Any]) -> str:
        value = str(proposal["value"])
        if value.strip():
            parse_port_range(value, "master_port_range")
        return value

    def initialize_settings(self) -> None:
        self.manager = SessionManager(
            SessionTimeouts(start=self.start_timeout, process_group=self.process_group_timeout),
            SessionDefaults(
                hosts=parse_hosts(self.default_hosts) if self.default_hosts.strip() else (),
                ssh_config=self.ssh_config,
                master_ports=self.master_port_range.strip() or None,
                max_ranks_per_node=self.max_ranks_per_node or None,
            ),
            limits=SessionLimits(
                max_sessions=self.max_sessions or None,
                max_node_ranks=self.max_ranks_per_node_all_sessions or None,
                owner="this Jupyter server",
                sessions_setting="DistServerApp.max_sessions",
                node_ranks_setting="DistServerApp.max_ranks_per_node_all_sessions",
            ),
        )
        self.settings["jupyter_dist_manager"] = self.manager
        # which notebook file a kernel runs (its path now, its id): `server.notebook_files`
        self.settings["jupyter_dist_files"] = NotebookFiles()
        runtime_dir = Path(getattr(self.serverapp, "runtime_dir", None) or jupyter_runtime_dir())
        self.records = SessionRecorder(runtime_dir, self.log)
        # before any session of ours exists: what dead servers left; a record under our own
        # pid is a predecessor's whose pid we got, so it goes now (we hold its contents)
        orphaned = find_orphaned(runtime_dir, self.log)
        for found in orphaned:
            if found.path == self.records.path:
                found.path.unlink(missing_ok=True)
        self.manager.add_listener(self._session_event)
        assert self.serverapp is not None
        reap_dead_folders(runtime_dir, self.log)  # dead servers' rank consoles (and keys)
        self.consoles = RankConsoles(
            self.serverapp.kernel_manager, runtime_dir, self.records.record()
        )
        self.settings["jupyter_dist_consoles"] = self.consoles
        self.manager.add_listener(self.consoles.observe)
        # a renamed notebook (or folder), whoever renamed it: its sessions follow
        if self.serverapp.event_logger is not None:
            self.serverapp.event_logger.add_listener(
                schema_id=CONTENTS_EVENTS, listener=self._contents_event
            )
        # in a thread: the event loop need not run yet, nor wait for the grace
        self._reaper = threading.Thread(
            target=self._reap, args=(orphaned,), name="jupyter_dist-reaper", daemon=True
        )
        if orphaned:
            self._reaper.start()

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        """Once the loop runs: forget, now and then, the notebook kernels that went away."""
        self._pruner = PeriodicCallback(self._prune, PRUNE_S * 1000)
        self._pruner.start()

    async def _prune(self) -> None:
        assert self.serverapp is not None
        try:
            await prune(self.manager, self.serverapp.kernel_manager)
        except Exception:
            self.log.exception("jupyter_dist: cannot forget the notebook kernels that went away")

    async def _contents_event(self, logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        """A file was renamed: the sessions, notebooks and requests that name it follow
        (which notebook a kernel runs is the File ID service's to say: a rename keeps the
        file's id)."""
        if data.get("action") != "rename":
            return
        old, new = str(data.get("source_path") or ""), str(data.get("path") or "")
        try:
            self.manager.notebook_renamed(old, new)
        except Exception:  # a rename must never fail for our sake
            self.log.exception("jupyter_dist: cannot follow the rename of %s to %s", old, new)

    def initialize_handlers(self) -> None:
        self.handlers.extend(API_HANDLERS)
        self.handlers.extend(LOG_HANDLERS)
        self.handlers.extend(RANK_KERNEL_HANDLERS)  # ahead of jupyter_server's own

    def _session_event(self, event: ManagerEvent) -> None:
        """Keep our record in step with the sessions."""
        try:
            self.records.observe(event)
        except Exception:  # a record must never take the server's sessions down
            self.log.exception("jupyter_dist: cannot update %s", self.records.path)

    def _reap(self, orphaned: list[Orphaned]) -> None:
        for found in orphaned:
            try:
                reap(found, self.log, self.reap_grace)
            except Exception:
                self.log.exception("jupyter_dist: cannot reap the sessions in %s", found.path)
            try:  # what its sessions held on clusters (Ray), by the dead server's names
                sweep_clusters(found.record, self.log)
            except Exception:
                self.log.exception("jupyter_dist: cannot sweep the clusters of %s", found.path)

    async def stop_extension(self) -> None:
        if self._pruner is not None:
            self._pruner.stop()
        if self.serverapp is not None and self.serverapp.event_logger is not None:
            self.serverapp.event_logger.remove_listener(
                schema_id=CONTENTS_EVENTS, listener=self._contents_event
            )
        self.log.info(
            "jupyter_dist: stopping %d session(s), %d of them starting",
            len(self.manager.sessions) + len(self.manager.starting),
            len(self.manager.starting),
        )
        try:  # those starting too: their Ray drivers, listeners and agents
            stopped = await self.manager.close("the Jupyter server is stopping")
            if stopped:
                self.log.info(
                    "jupyter_dist: stopped the start of session(s) %s: what they had started "
                    "is gone",
                    ", ".join(map(repr, stopped)),
                )
        finally:
            self.records.remove()
            self.consoles.close()
        if self._reaper.is_alive():  # a predecessor's leftovers: let the SIGKILLs go out
            await asyncio.to_thread(self._reaper.join, self.reap_grace + 10)
