"""A full temporary folder (``/tmp`` of a shared login node often is) costs the rank logs,
never a cell's output or result; a node agent that cannot make its folder there says so.

A real tmpfs of a few MiB is the temporary folder (``TMPDIR``), filled to the last page
once the session runs; the last test runs the notebook side in a mount namespace of its
own whose ``/tmp`` and ``/var/tmp`` are full. Both need root (mounting).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_dist.display import rank_logs
from jupyter_dist.text import strip_ansi
from tests.conftest import CellOutput
from tests.system_needs import require

Run = Callable[[str], CellOutput]
NOTICE = "rank logs are off for this cell: no space left on device in "
SESSION = "fulltmp"


def mount_problems() -> list[str]:
    if sys.platform != "linux":
        return [f"needs Linux tmpfs mounts (this is {sys.platform})"]
    problems = []
    if os.geteuid() != 0:
        problems.append("must run as root (it mounts a tmpfs)")
    for tool in ("mount", "umount", "unshare"):
        if shutil.which(tool) is None:
            problems.append(f"`{tool}` not found (Debian package util-linux)")
    return problems


@pytest.fixture
def small_tmpfs() -> Iterator[Path]:
    """A 4 MiB tmpfs at a short path (rank sockets live below it), unmounted at the end."""
    require("a tmpfs of our own", mount_problems())
    folder = Path(tempfile.mkdtemp(prefix="jdt-full-", dir="/tmp"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=1777", "tmpfs", str(folder)],
        check=False,
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        folder.rmdir()
        require("a tmpfs of our own", [f"mount failed: {mounted.stderr.strip()}"])
    try:
        yield folder
    finally:
        # lazily if a process still holds something there: it goes when they let go
        unmounted = subprocess.run(["umount", str(folder)], check=False, capture_output=True)
        if unmounted.returncode != 0:
            subprocess.run(["umount", "-l", str(folder)], check=True)
        folder.rmdir()


def fill(folder: Path) -> None:
    """Write a file in ``folder`` until the disk has no page left."""
    fd = os.open(folder / "fill", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 16, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    with pytest.raises(OSError) as full:
        (folder / "probe").write_bytes(b"x")
    assert full.value.errno == errno.ENOSPC


@pytest.fixture
def full_later(small_tmpfs: Path, shell: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The tmpfs is the temporary folder of this notebook process (its cell logs) and of
    the session's agent (its ranks' logs), from a session started while it had room."""
    monkeypatch.setenv("TMPDIR", str(small_tmpfs))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    monkeypatch.setattr(rank_logs, "_root", None)
    # ipykernel leaves fds 1 and 2 alone under pytest: the ranks must capture them, as
    # they do in a notebook (pytest sets this again for the test; the agent has started)
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    try:
        # its output is logged: this process's log folder is made there now, with room
        start = f"%%distributed --procs 2 --session {SESSION}\nimport os\nprint('started')"
        result = shell.run_cell(start)
        assert result.success, result.error_in_exec
        yield small_tmpfs
    finally:
        shell.run_line_magic("dist", f"shutdown --session {SESSION}")


def test_a_full_disk_costs_the_logs_not_the_output(full_later: Path, run: Run) -> None:
    fill(full_later)
    out = run(
        f"%%distributed --session {SESSION} --timeout 120\n"
        "import sys\n"
        "rank = os.environ['RANK']\n"
        "for n in range(300):\n"
        "    print(f'python line {n} of rank {rank}')\n"
        "sys.stdout.flush()\n"
        # C code writes to fd 1: more than a pipe holds, which a rank whose pipe reader
        # stopped at its log's first failed write would block on
        "c_lines = (b'C line %d of rank %s\\n' % (n, rank.encode()) for n in range(20_000))\n"
        "os.write(1, b''.join(c_lines))"
    )
    assert out.ok, out.stdout + out.stderr
    for rank in (0, 1):
        for n in range(300):
            assert f"[rank {rank}] python line {n} of rank {rank}\n" in out.stdout
    # the pipe's reader kept going: everything the ranks wrote before their last print
    # reached the notebook (fd 1 is read on a thread: its very last lines may follow later)
    for rank in (0, 1):
        assert out.stdout.count(f"[rank {rank}] C line 10000 of rank {rank}\n") == 1
    assert out.stdout.count(NOTICE) == 1, out.stdout
    assert f"{NOTICE}{full_later}/" in out.stdout
    assert "free space there or point TMPDIR at another folder" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr

    (full_later / "fill").unlink()  # the disk was freed: the next cell has its logs again
    out = run(f"%%distributed --session {SESSION}\nprint('logged again')")
    assert out.ok and "] logged again" in out.stdout
    assert "rank logs are off" not in out.stdout
    logs = full_later.glob("jupyter_dist-logs-*/text/cell-*/rank-1.log")
    last = max(logs, key=lambda log: int(log.parent.name.removeprefix("cell-")))
    assert last.read_text() == "logged again\n"


def test_a_full_disk_at_spawn_names_the_node_and_the_folder(full_later: Path, run: Run) -> None:
    """The agent's folder was made while there was room; a resize then writes the new
    rank's connection file there: on a full disk it fails at once, naming the node and
    the folder, and is undone (the ranks keep their variables); once space is freed the
    next resize works."""
    assert run(f"%%distributed --session {SESSION}\nkept = os.environ['RANK']").ok
    fill(full_later)
    out = run(f"%dist resize --procs 3 --session {SESSION}")
    text = strip_ansi(out.stdout + out.stderr + str(out.error))
    assert not out.ok, text
    assert "rank 2: cannot write its connection file: no space left on device in " in text, text
    assert f"in {full_later}/jd-" in text and "free space there or point" in text, text
    assert "node '" in text and "Errno" not in text, text
    assert "the resize was undone" in text and "`%dist resize` tries again" in text, text
    (full_later / "fill").unlink()
    grown = run(f"%dist resize --procs 3 --session {SESSION}")
    assert grown.ok, grown.stdout + grown.stderr
    out = run(f"%%distributed --session {SESSION}\nprint('kept', globals().get('kept'))")
    assert out.ok, out.stdout + out.stderr
    assert "[rank 1] kept 1" in out.stdout and "[rank 2] kept None" in out.stdout, out.stdout


NOTEBOOK = """
import os
from IPython.testing.globalipapp import start_ipython

ip = start_ipython()  # IPython itself needs a temporary folder to start
ip.run_line_magic("load_ext", "jupyter_dist")
fd = os.open("/tmp/fill", os.O_WRONLY | os.O_CREAT)
for size in (1 << 16, 1 << 12, 1):
    try:
        while True:
            os.write(fd, b"\\0" * size)
    except OSError:
        pass
result = ip.run_cell("%%distributed --procs 1\\nprint('never')")
print("CELL", "ok" if result.success else "failed")
"""

#: folders below /tmp or /var/tmp that the namespace keeps: the project (its checkout may
#: live in a temporary folder, a fresh clone's often does) and its virtual environment
TEMP_ROOTS = (Path("/tmp"), Path("/var/tmp"))


def namespace_script() -> str:
    """Shell lines that make /tmp and /var/tmp of the namespace one small tmpfs, the working
    folder too, so that the agent finds no temporary folder where it could make its own;
    the project and the interpreter running it stay where they are (bound back in through
    a stash on another tmpfs, mounted before the real /tmp is covered)."""
    project = Path(__file__).resolve().parents[2]
    keep = sorted(
        {
            p
            for p in (project, Path(sys.prefix).resolve())
            if any(p.is_relative_to(t) for t in TEMP_ROOTS)
        }
    )
    steps = []
    if keep:
        steps.append("mount -t tmpfs tmpfs /mnt")
        for i, path in enumerate(keep):
            steps += [f"mkdir /mnt/{i}", f"mount --bind {shlex.quote(str(path))} /mnt/{i}"]
    steps += ["mount -t tmpfs -o size=1m tmpfs /tmp", "mount --bind /tmp /var/tmp"]
    for i, path in enumerate(keep):
        steps += [
            f"mkdir -p {shlex.quote(str(path))}",
            f"mount --bind /mnt/{i} {shlex.quote(str(path))}",
        ]
    return " && ".join([*steps, "cd /tmp"])


def test_an_agent_without_a_temporary_folder_says_so() -> None:
    require("a mount namespace of our own", mount_problems())
    env = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TEMP", "TMP")}
    done = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'{namespace_script()} && exec "$0" -c "$1"',
            sys.executable,
            textwrap.dedent(NOTEBOOK),
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    if "CELL" not in done.stdout and "mount:" in done.stderr:
        require("a mount namespace of our own", [done.stderr.strip()])
    assert "CELL failed" in done.stdout, done.stdout + done.stderr
    # what the cell showed: one clear error, no traceback
    shown = done.stdout.split("CELL failed")[0]
    assert "Traceback" not in shown, shown
    assert "AgentError: node " in strip_ansi(shown)
    assert (
        "the agent exited (exit code 1); its last output:\n"
        "agent: cannot make its folder: No usable temporary directory found in "
        "['/tmp', '/var/tmp'"
    ) in shown
    assert "; free space in one of them or point TMPDIR at another folder" in shown
