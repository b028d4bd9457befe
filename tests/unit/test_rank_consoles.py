"""Rank consoles' files, without a server: each server writes and removes only its own, in
its own folder or in a folder the user shares between servers, and a dead server's go."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from jupyter_dist.server.process_records import Machine, ServerRecord, create_time
from jupyter_dist.server.rank_consoles import (
    FOLDER_PREFIX,
    RankConsoles,
    file_prefix,
    reap_dead_folders,
)

log = logging.getLogger(__name__)


class KernelManager:
    """What RankConsoles uses of jupyter_client's MultiKernelManager (>= 8.4)."""

    def __init__(self, external_connection_dir: str | None = None) -> None:
        self.external_connection_dir = external_connection_dir
        self.kernel_id_to_connection_file: dict[str, Path] = {}

    def __contains__(self, kernel_id: str) -> bool:
        return kernel_id in self.kernel_id_to_connection_file

    def list_kernel_ids(self) -> list[str]:
        return list(self.kernel_id_to_connection_file)


def dead_server() -> ServerRecord:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    started = create_time(proc.pid)
    proc.wait()
    return ServerRecord(proc.pid, started or 1.0, (), Machine.here())


def this_server() -> ServerRecord:
    return ServerRecord(os.getpid(), create_time(os.getpid()) or 1.0, (), Machine.here())


def test_a_server_without_a_folder_gets_a_private_one_removed_when_it_stops(
    tmp_path: Path,
) -> None:
    manager = KernelManager()
    consoles = RankConsoles(manager, tmp_path, this_server())
    assert manager.external_connection_dir == str(consoles.own)
    assert consoles.own.name.startswith(FOLDER_PREFIX)
    assert consoles.own.stat().st_mode & 0o777 == 0o700
    (consoles.own / f"{file_prefix(consoles.tag)}s-rank-0.json").write_text("{}")
    assert reap_dead_folders(tmp_path, log) == []  # a live server's folder stays
    consoles.close()
    assert not consoles.own.exists()


def test_in_a_users_shared_folder_a_server_removes_only_its_own(tmp_path: Path) -> None:
    shared = tmp_path / "external_kernels"
    shared.mkdir()
    mine = RankConsoles(KernelManager(str(shared)), tmp_path / "runtime", this_server())
    dead = RankConsoles(KernelManager(str(shared)), tmp_path / "runtime", dead_server())
    other = shared / "a-kernel-of-the-users.json"
    other.write_text("{}")
    for consoles in (mine, dead):
        for name in ("s", "t"):
            consoles.path_of(name, 0).write_text("{}")
    mine.forget("s")  # the other server's session "s" keeps its console
    assert not mine.path_of("s", 0).exists()
    assert mine.path_of("t", 0).exists() and dead.path_of("s", 0).exists()
    assert reap_dead_folders(tmp_path / "runtime", log) == [dead.own]
    assert not dead.path_of("s", 0).exists() and not dead.path_of("t", 0).exists()
    assert mine.path_of("t", 0).exists() and other.exists() and mine.own.exists()
    mine.close()
    assert sorted(p.name for p in shared.iterdir()) == [other.name]
    assert not mine.own.exists()


def test_a_folder_that_is_not_ours_is_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / f"{FOLDER_PREFIX}host-1").symlink_to(target)
    assert reap_dead_folders(tmp_path, log) == []
    assert target.exists()


def test_a_marker_that_cannot_be_read_is_skipped(tmp_path: Path, caplog: Any) -> None:
    folder = tmp_path / f"{FOLDER_PREFIX}host-1"
    folder.mkdir()
    (folder / "server.json").write_text("not json")
    assert reap_dead_folders(tmp_path, log) == []
    assert folder.exists() and "skipping" in caplog.text
