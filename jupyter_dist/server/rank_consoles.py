"""A rank's kernel made a kernel of the Jupyter server, so that JupyterLab can open a console
(or its debugger) on it: the rank kernels are ordinary ipykernels.

jupyter_server adopts kernels it did not start through an external-kernels folder (the
kernel manager's ``external_connection_dir``, from ``ServerApp.allow_external_kernels``): a
connection file written there becomes a kernel of the server, listed with the others, that
the server does not own. So a console's "shut down kernel" leaves the rank alone, and the
rank stays the session's. When the server has no such folder, the extension gives its
kernel manager one of its own in the runtime folder, where only it writes. The file is
removed when its session restarts or stops, and the server then drops the kernel.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from jupyter_dist.common.payloads import ManagerEvent
from jupyter_dist.control.session import Session
from jupyter_dist.errors import SessionError

log = logging.getLogger(__name__)
#: the external-kernels folder the extension gives a server that has none
FOLDER = "jupyter_dist-rank-kernels"
#: the kernel spec name the adopted kernels carry (their language and display name)
KERNEL_NAME = "python3"
_FILE = re.compile(r"jupyter-dist-(?P<name>.+)-rank-(?P<rank>\d+)\.json")


class RankConsoles:
    """Connection files of rank kernels in the server's external-kernels folder."""

    def __init__(self, kernel_manager: Any, runtime_dir: Path) -> None:
        self.kernel_manager = kernel_manager
        adopts = hasattr(kernel_manager, "kernel_id_to_connection_file")  # jupyter_client >= 8.4
        if adopts and getattr(kernel_manager, "external_connection_dir", None) is None:
            kernel_manager.external_connection_dir = str(runtime_dir / FOLDER)

    @property
    def folder(self) -> Path:
        found = getattr(self.kernel_manager, "external_connection_dir", None)
        if not found:
            raise SessionError(
                "opening a console on a rank needs jupyter_client 8.4 or newer in the "
                "Jupyter server's environment (external kernels)"
            )
        return Path(found)

    def path_of(self, session: str, rank: int) -> Path:
        return self.folder / f"jupyter-dist-{session}-rank-{rank}.json"

    def adopt(self, session: Session, rank: int) -> str:
        """The server's kernel id of ``rank``'s kernel, adopted now if it is not yet."""
        info = session.connection_info()
        entry = next((r for r in info["ranks"] if r["rank"] == rank), None)
        if entry is None or entry["connection"] is None:
            raise SessionError(f"rank {rank} of session {session.name!r} has no kernel")
        path = self.path_of(session.name, rank)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        connection = {
            **entry["connection"],
            "key": info["key"],
            "signature_scheme": info["signature_scheme"],
            "kernel_name": KERNEL_NAME,
        }
        fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:  # the session's key: owner-only, written whole
            json.dump(connection, f)
        os.replace(path.with_suffix(".tmp"), path)
        self._drop_stale()
        self.kernel_manager.list_kernel_ids()  # the manager takes the new file in
        for kernel_id, file in self.kernel_manager.kernel_id_to_connection_file.items():
            if Path(file) == path:
                return str(kernel_id)
        raise SessionError(f"the Jupyter server did not take rank {rank}'s kernel in")

    def forget(self, session: str) -> None:
        """Session ``session`` restarted or stopped: its ranks' kernels leave the server."""
        try:
            folder = self.folder
        except SessionError:
            return
        if not folder.is_dir():
            return
        for path in folder.iterdir():
            found = _FILE.fullmatch(path.name)
            if found and found.group("name") == session:
                path.unlink(missing_ok=True)
        self._drop_stale()
        self.kernel_manager.list_kernel_ids()

    def _drop_stale(self) -> None:
        """Forget files whose kernel the server already let go of (a console shut it
        down): the manager would otherwise neither adopt the file again nor let it go."""
        mapping = self.kernel_manager.kernel_id_to_connection_file
        for kernel_id in [k for k in mapping if k not in self.kernel_manager]:
            del mapping[kernel_id]

    def observe(self, event: ManagerEvent) -> None:
        """A manager listener: forget a session's kernels when it restarts or goes."""
        try:
            if event["type"] == "removed":
                self.forget(event["name"])
            elif event["type"] == "session" and event["session"]["state"] in (
                "restarting",
                "stopped",
            ):
                self.forget(event["session"]["name"])
        except Exception:  # never take the session's own news down
            log.exception("jupyter_dist: cannot drop the rank kernels of a session")
