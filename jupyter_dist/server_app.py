"""The jupyter-server extension: sessions owned by the server, not by one notebook kernel.

Enabled on install (``jupyter_server_config.d/jupyter_dist.json``). It runs the same
`SessionManager` the magic runs in-process, on the server's event loop, and stops every
session when the server stops.
"""

from __future__ import annotations

from jupyter_server.extension.application import ExtensionApp
from traitlets import Float, Unicode

from jupyter_dist.manager import SessionManager
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

    def initialize_settings(self) -> None:
        self.manager = SessionManager(
            SessionTimeouts(start=self.start_timeout, process_group=self.process_group_timeout)
        )
        self.settings["jupyter_dist_manager"] = self.manager

    def initialize_handlers(self) -> None:
        self.handlers.extend(HANDLERS)

    async def stop_extension(self) -> None:
        self.log.info("jupyter_dist: stopping %d session(s)", len(self.manager.sessions))
        await self.manager.shutdown_all()
