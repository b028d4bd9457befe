"""Which known_hosts files the SSH launcher checks a host key against, from the ssh config's
``UserKnownHostsFile`` and ``GlobalKnownHostsFile`` (as asyncssh parses them: a list of
paths, ``[]`` for ``none``, None when unset). None left means the connection is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jupyter_dist.control.launchers.ssh import known_hosts_files, user_known_hosts


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    return tmp_path


def test_unset_means_ssh_default_when_it_exists(home: Path) -> None:
    assert known_hosts_files(None, None) == []
    (home / ".ssh" / "known_hosts").write_text("")
    assert known_hosts_files(None, None) == [str(home / ".ssh" / "known_hosts")]


def test_none_dev_null_and_missing_files_leave_nothing(home: Path) -> None:
    (home / ".ssh" / "known_hosts").write_text("")  # not read: the config names others
    assert known_hosts_files([], None) == []
    assert known_hosts_files([os.devnull], [os.devnull]) == []
    assert known_hosts_files([str(home / "missing")], None) == []


def test_the_global_files_still_count_with_user_files_none(home: Path) -> None:
    shared = home / "ssh_known_hosts"
    shared.write_text("")
    assert known_hosts_files([], [str(shared)]) == [str(shared)]
    assert known_hosts_files(["~/missing", "~/ssh_known_hosts"], None) == [str(shared)]


def test_where_to_add_a_key() -> None:
    assert user_known_hosts(None) == "~/.ssh/known_hosts"
    assert user_known_hosts([]) == "~/.ssh/known_hosts"
    assert user_known_hosts([os.devnull]) == "~/.ssh/known_hosts"
    assert user_known_hosts(["~/.ssh/cluster_hosts", "x"]) == "~/.ssh/cluster_hosts"
