"""Which notebook file a notebook kernel runs: the file's path now, and its id.

A kernel names its notebook by the path it was started with (``?path=``, from the
``JPY_SESSION_NAME`` the server gave it). After a rename that is the old name, which a new
file may have since: JupyterLab gives ``Untitled.ipynb`` again to the next new notebook.
So the path a kernel sends is not taken on trust. The server's own session of the kernel
(``/api/sessions``; JupyterLab moves it along with a rename) says the notebook's path now,
and the File ID service (jupyter_server_fileid, ``file_id_manager`` in the server's
settings) gives that file's id, which a rename keeps and a new file at an old name does
not share. A kernel is remembered with its file, so that while a rename is half done (the
file moved, the kernel's session not yet) it stays the notebook it was. Without the File
ID service, paths alone tell notebooks apart.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

from jupyter_core.utils import ensure_async

from jupyter_dist.control.cell_queue import Sender

log = logging.getLogger(__name__)
#: notebook kernels remembered with their file (the oldest are forgotten first)
MAX_KERNELS = 1024


class FileIds(Protocol):
    """What is used of jupyter_server_fileid's ``BaseFileIdManager``."""

    def get_id(self, path: str) -> str | None: ...

    def index(self, path: str) -> str | None: ...

    def get_path(self, id: str) -> str | None: ...


class NotebookFiles:
    """Senders with their notebook's path now and file id, as this server knows them."""

    def __init__(self) -> None:
        #: kernel id -> the id of the file it ran last time it was asked
        self.kernels: OrderedDict[str, str] = OrderedDict()

    async def resolve(self, sender: Sender, settings: Mapping[str, Any]) -> Sender:
        """``sender`` (a checked one: its kernel is this server's) with its notebook's path
        now and its file id; a sender that names no kernel (the sidebar) as it is."""
        if not sender.kernel_id:
            return sender
        path = await _session_path(settings, sender.kernel_id) or sender.path.strip("/")
        ids: FileIds | None = settings.get("file_id_manager")
        if ids is None:
            return Sender(path, sender.kernel_id)
        try:
            file_id = await self._file_id(ids, path, settings)
            if file_id is None:  # the file moved away, the kernel's session not yet with it
                file_id = self.kernels.get(sender.kernel_id)
                path = (ids.get_path(file_id) if file_id else None) or path
        except Exception:  # the notebook is still named by its path
            log.exception("jupyter_dist: cannot ask the File ID service about %s", path)
            return Sender(path, sender.kernel_id)
        if file_id:
            self.kernels[sender.kernel_id] = file_id
            self.kernels.move_to_end(sender.kernel_id)
            while len(self.kernels) > MAX_KERNELS:
                self.kernels.popitem(last=False)
        return Sender(path, sender.kernel_id, file_id or "")

    @staticmethod
    async def _file_id(ids: FileIds, path: str, settings: Mapping[str, Any]) -> str | None:
        """The id of the file at ``path``, given it now if it has none; None when no file
        is there."""
        if not path:
            return None
        found = ids.get_id(path)
        if found:
            return found
        contents = settings.get("contents_manager")
        if contents is None or not await ensure_async(contents.file_exists(path)):
            return None
        return ids.index(path)


async def _session_path(settings: Mapping[str, Any], kernel_id: str) -> str:
    """The path of the server's session of kernel ``kernel_id`` ("" if it has none)."""
    sessions = settings.get("session_manager")
    if sessions is None:
        return ""
    with contextlib.suppress(Exception):  # no session: a kernel started on its own
        model = await sessions.get_session(kernel_id=kernel_id)
        return str(model.get("path") or "").strip("/")
    return ""


__all__ = ["MAX_KERNELS", "FileIds", "NotebookFiles"]
