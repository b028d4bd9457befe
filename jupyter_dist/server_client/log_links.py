"""Links to a cell's rank logs, served by the Jupyter server that launched this kernel.

The cell view writes each rank's output to a log folder in the temporary folder
(`display.rank_logs.RankLogs`); under a server with jupyter_dist enabled that folder is
served at ``<base URL>/jupyter-dist/logs/...`` (`server.log_files`), so the view's "logs"
line is a link that opens in the browser, where a plain path would mean nothing.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from urllib.parse import quote, urlparse

from jupyter_dist.common.wire_names import LOGS_FOLDER_PREFIX, LOGS_ROUTE
from jupyter_dist.server_client.discovery import ServerInfo


def log_folder_url(server: ServerInfo, folder: Path, base: Path | None = None) -> str | None:
    """The path (from the server's origin, base URL included) at which ``server`` serves
    ``folder``; None for a folder it does not serve, or when there is no temporary folder
    (every candidate full or read-only: the cell's logs are off, `display.rank_logs`)."""
    try:
        base = base or Path(tempfile.gettempdir())
        relative = folder.resolve().relative_to(base.resolve())
    except (ValueError, OSError):
        return None
    if not relative.parts or not relative.parts[0].startswith(LOGS_FOLDER_PREFIX):
        return None
    prefix = urlparse(server.url).path.rstrip("/")
    return f"{prefix}{LOGS_ROUTE}/{quote(relative.as_posix())}/"
