"""The jupyter-server extension: sessions owned by the server, not by one notebook kernel.

Enabled on install (``jupyter_server_config.d/jupyter_dist.json``). It runs the same
`SessionManager` the magic runs in-process, on the server's event loop, and stops every
session when the server stops.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Float, Unicode, validate

from jupyter_dist.hosts import parse_hosts
from jupyter_dist.manager import SessionDefaults, SessionManager
from jupyter_dist.rendezvous import parse_port_range
from jupyter_dist.server_handlers import HANDLERS
from jupyter_dist.session import SessionTimeouts


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
            ),
        )
        self.settings["jupyter_dist_manager"] = self.manager

    def initialize_handlers(self) -> None:
        self.handlers.extend(HANDLERS)

    async def stop_extension(self) -> None:
        self.log.info("jupyter_dist: stopping %d session(s)", len(self.manager.sessions))
        await self.manager.shutdown_all()
