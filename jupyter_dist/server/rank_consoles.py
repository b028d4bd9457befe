"""A rank's kernel made a kernel of the Jupyter server, so that JupyterLab can open a console
(or its debugger) on it: the rank kernels are ordinary ipykernels.

jupyter_server adopts kernels it did not start through an external-kernels folder (the
kernel manager's ``external_connection_dir``, from ``ServerApp.allow_external_kernels``): a
connection file written there becomes a kernel of the server, listed with the others, that
the server does not own. So a console's "shut down kernel" leaves the rank alone, and the
rank stays the session's. The file is removed when its session restarts or stops, and the
server then drops the kernel.

A connection file holds its session's key: whoever can use the kernel it names runs code
on the rank. So the rank consoles of a server are that server's alone. Every server keeps
its own folder, ``jupyter_dist-rank-kernels-HOST-PID`` in the runtime folder (mode 0700;
several servers of one user share the runtime folder, and a server adopts every file of
its external-kernels folder), with a marker, `MARKER`, naming the server as
`server.process_records` names it (pid, start time, machine). When the server has no
external-kernels folder, that folder becomes it. The folder goes when the server stops;
a starting server removes those of dead servers of this machine (`reap_dead_folders`),
so a killed server's session keys do not stay behind, nor its dead kernels in a list.

When the user gave the server an external-kernels folder, that folder is theirs, and
whatever is in it is meant for every server given it (that is what the option does): the
rank consoles go there, since no other folder is adopted, and every server sharing that
folder lists them. Their files carry this server's ``HOST-PID``, so that a server only
ever removes its own (a session of the same name on another server keeps its consoles),
and the marker of our own folder names the user's folder, so that a dead server's files
there are removed too. Not to share rank consoles, give each server its own folder (or
none: the extension then makes its own).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import time
from pathlib import Path
from typing import Any

from jupyter_dist.common.payloads import ManagerEvent
from jupyter_dist.control.session import Session
from jupyter_dist.errors import SessionError
from jupyter_dist.server.process_records import (
    Machine,
    ServerRecord,
    read_record_with_extra,
    server_tag,
    write_record,
)

log = logging.getLogger(__name__)
#: a server's own folder, in the runtime folder: this, then ``HOST-PID``
FOLDER_PREFIX = "jupyter_dist-rank-kernels-"
#: in a server's own folder: who made it (a `ServerRecord`) and where its consoles are
MARKER = "server.json"
#: seconds a folder without a marker is left alone (its server may be writing it now)
UNMARKED_GRACE_S = 120.0
#: the kernel spec name the adopted kernels carry (their language and display name)
KERNEL_NAME = "python3"
_REST = re.compile(r"(?P<name>.+)-rank-(?P<rank>\d+)\.json")
#: a rank console's file of any server (``file_prefix``, then as `_REST`)
_OTHERS = re.compile(r"jupyter-dist-.+--.+-rank-\d+\.json")


def file_prefix(tag: str) -> str:
    """How the connection files of the server ``tag`` (``HOST-PID``) begin."""
    return f"jupyter-dist-{tag}--"


def _own_folder(path: Path) -> bool:
    """Whether ``path`` is a folder of this user's, not a link to one."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()


def _remove_files(folder: Path, tag: str) -> int:
    """Remove the connection files of server ``tag`` from ``folder``; how many."""
    removed = 0
    prefix = file_prefix(tag)
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        if entry.name.startswith(prefix) and entry.is_file(follow_symlinks=False):
            try:
                os.unlink(entry.path)
                removed += 1
            except OSError as err:
                log.warning("jupyter_dist: cannot remove %s: %s", entry.path, err)
    return removed


def reap_dead_folders(runtime_dir: Path, logger: logging.Logger) -> list[Path]:
    """Remove the rank-console folders in ``runtime_dir`` of servers of this machine that
    are gone (and their files in the external-kernels folder their marker names); returns
    the folders removed. Those of live servers, of other machines, or that cannot be read
    are left alone."""
    removed: list[Path] = []
    here = Machine.here()
    if not here.boot_id:
        return removed
    try:
        folders = sorted(runtime_dir.glob(f"{FOLDER_PREFIX}*"))
    except OSError as err:
        logger.warning("jupyter_dist: cannot list %s: %s", runtime_dir, err)
        return removed
    for folder in folders:
        if not _own_folder(folder):
            continue
        try:
            record, data = read_record_with_extra(folder / MARKER)
        except FileNotFoundError:
            try:
                age = time.time() - folder.stat().st_mtime
            except OSError:
                continue
            if age < UNMARKED_GRACE_S:
                continue  # a server starting now: it writes the marker next
            record, data = None, {}
        except (OSError, ValueError) as err:
            logger.warning("jupyter_dist: skipping %s: %s", folder / MARKER, err)
            continue
        if record is not None:
            if record.machine != here or record.alive():
                continue
            where = data.get("connection_dir")
            if isinstance(where, str) and where and Path(where) != folder:
                _remove_files(Path(where), server_tag(record.pid, record.machine.host))
        shutil.rmtree(folder, ignore_errors=True)
        if record is not None:
            logger.info(
                "jupyter_dist: removed the rank consoles of dead server pid %d (%s)",
                record.pid,
                folder,
            )
        removed.append(folder)
    return removed


def _written(path: Path) -> dict[str, Any] | None:
    """The connection a rank console's file holds, None when there is none (or unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


class RankConsoles:
    """Connection files of this server's rank kernels in its external-kernels folder."""

    def __init__(self, kernel_manager: Any, runtime_dir: Path, server: ServerRecord) -> None:
        self.kernel_manager = kernel_manager
        self.tag = server_tag(server.pid, server.machine.host)
        self.own = runtime_dir / f"{FOLDER_PREFIX}{self.tag}"
        #: whether the user gave the server its external-kernels folder (shared, see above)
        self.users_folder = False
        if not hasattr(kernel_manager, "kernel_id_to_connection_file"):  # jupyter_client < 8.4
            return
        found = getattr(kernel_manager, "external_connection_dir", None)
        self.users_folder = found is not None
        connection_dir = Path(found) if found is not None else self.own
        if _own_folder(self.own):  # a dead server's with our pid: not yet reaped
            shutil.rmtree(self.own, ignore_errors=True)
        self.own.mkdir(mode=0o700, parents=True)
        os.chmod(self.own, 0o700)
        write_record(self.own / MARKER, server, {"connection_dir": str(connection_dir)})
        if not self.users_folder:
            kernel_manager.external_connection_dir = str(self.own)

    @property
    def folder(self) -> Path:
        found = getattr(self.kernel_manager, "external_connection_dir", None)
        if not found:
            raise SessionError(
                "opening a console on a rank needs jupyter_client 8.4 or newer in the "
                "Jupyter server's environment (external kernels)"
            )
        return Path(found)

    def rank_of(self, kernel_id: str) -> tuple[str, int] | None:
        """The session and rank of this server's kernel ``kernel_id`` when it is a rank's
        console kernel of this server; None for any other kernel."""
        files = getattr(self.kernel_manager, "kernel_id_to_connection_file", {})
        file = files.get(kernel_id)
        if file is None:
            return None
        name, prefix = Path(file).name, file_prefix(self.tag)
        found = _REST.fullmatch(name[len(prefix) :]) if name.startswith(prefix) else None
        return None if found is None else (found.group("name"), int(found.group("rank")))

    def of_another_server(self, kernel_id: str) -> bool:
        """Whether ``kernel_id`` is a rank kernel another server adopted into the
        external-kernels folder this one shares (the user gave both the same folder)."""
        files = getattr(self.kernel_manager, "kernel_id_to_connection_file", {})
        file = files.get(kernel_id)
        return file is not None and bool(_OTHERS.fullmatch(Path(file).name))

    def path_of(self, session: str, rank: int) -> Path:
        return self.folder / f"{file_prefix(self.tag)}{session}-rank-{rank}.json"

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
        if _written(path) not in (None, connection):
            # the rank was replaced alone (a heal): its old kernel leaves the server first,
            # which would otherwise keep it under the same file, and the new one comes in
            # under a new id that a console moves to
            path.unlink(missing_ok=True)
            self._drop_stale()
            self.kernel_manager.list_kernel_ids()
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
        prefix = file_prefix(self.tag)
        for path in folder.iterdir():
            if not path.name.startswith(prefix):
                continue  # another server's (in a folder the user shares between them)
            found = _REST.fullmatch(path.name[len(prefix) :])
            if found and found.group("name") == session:
                path.unlink(missing_ok=True)
        self._drop_stale()
        self.kernel_manager.list_kernel_ids()

    def close(self) -> None:
        """The server stops: its rank consoles go, and its folder with them."""
        if not hasattr(self.kernel_manager, "kernel_id_to_connection_file"):
            return
        if self.users_folder:
            _remove_files(self.folder, self.tag)
        else:
            _remove_files(self.own, self.tag)
        try:
            self._drop_stale()
            self.kernel_manager.list_kernel_ids()  # while the folder is there to look at
        except Exception:
            log.exception("jupyter_dist: cannot drop the rank kernels from the server's list")
        shutil.rmtree(self.own, ignore_errors=True)

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
