"""What a server remembers of each notebook (`control.notebook_paths`), and how the
manager tells notebooks apart by their file, not their name (`SessionManager`)."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_dist.common.notebook_names import numbered, session_name_for
from jupyter_dist.common.spec import check_session_name
from jupyter_dist.control.cell_queue import CellQueue, Sender
from jupyter_dist.control.manager import SessionManager
from jupyter_dist.control.notebook_paths import MAX_NOTEBOOKS, NotebookPaths, moved
from jupyter_dist.control.recovery import SessionState


def test_moved_follows_a_file_or_a_folder_and_nothing_else() -> None:
    assert moved("Untitled.ipynb", "Untitled.ipynb", "train.ipynb") == "train.ipynb"
    assert moved("runs/a.ipynb", "runs", "old/runs") == "old/runs/a.ipynb"
    assert moved("runs2/a.ipynb", "runs", "x") is None  # a prefix is not a folder
    assert moved("other.ipynb", "Untitled.ipynb", "train.ipynb") is None
    assert moved("", "", "x") is None


def test_what_is_remembered_under_a_path_moves_with_its_notebook_and_stays_bounded() -> None:
    paths = NotebookPaths()
    paths.note_lost("a.ipynb", "session 'a-123456' was shut down")
    paths.note_used("runs/b.ipynb", "big")
    paths.note_used("0f3c-id", "ids-stay")
    paths.rename("a.ipynb", "b.ipynb")
    paths.rename("/runs", "done")  # the contents API strips slashes
    assert paths.lost == {"b.ipynb": "session 'a-123456' was shut down"}
    assert paths.last_used == {"done/b.ipynb": "big", "0f3c-id": "ids-stay"}
    for i in range(MAX_NOTEBOOKS + 10):
        paths.note_used(f"n{i}.ipynb", "s")
    assert len(paths.last_used) == MAX_NOTEBOOKS
    assert f"n{MAX_NOTEBOOKS + 9}.ipynb" in paths.last_used


def test_a_number_after_a_notebooks_name_keeps_it_a_session_name() -> None:
    name = session_name_for("x" * 200 + ".ipynb")
    assert name is not None and len(name) == 64
    assert check_session_name(numbered(name, 2)) == numbered(name, 2)
    assert numbered(name, 12).endswith("-12") and len(numbered(name, 12)) <= 64
    assert numbered("Untitled-3f2a1c", 2) == "Untitled-3f2a1c-2"


class Stub:
    """What the manager reads of a running session."""

    def __init__(self, name: str, notebook: str = "", notebook_id: str = "") -> None:
        self.name = name
        self.notebook = notebook
        self.notebook_id = notebook_id
        self.notebooks: dict[str, Any] = {}
        self.turns = CellQueue()
        self.state = SessionState.READY

    def status(self) -> dict[str, Any]:
        return {"name": self.name}


TRAIN = Sender("train.ipynb", "k-train", "id-train")  # once Untitled.ipynb, renamed
NEW = Sender("Untitled.ipynb", "k-new", "id-new")  # a new file that got the old name


def manager_with(*sessions: Stub) -> SessionManager:
    manager = SessionManager()
    for session in sessions:
        manager.sessions[session.name] = session  # type: ignore[assignment]
    return manager


def test_a_new_file_with_a_renamed_notebooks_old_name_is_another_notebook() -> None:
    base = session_name_for("Untitled.ipynb")
    assert base is not None
    renamed = Stub(base, "Untitled.ipynb", "id-train")
    manager = manager_with(renamed)
    manager.notebook_renamed("Untitled.ipynb", "train.ipynb")
    assert renamed.notebook == "train.ipynb"
    # the renamed notebook's kernel finds its session; the new file finds none, and its
    # own session gets a name of its own
    assert manager.notebook_session(TRAIN) == (renamed, "")
    assert manager.notebook_session(NEW) == (None, "")
    assert manager.name_for(NEW, base) == f"{base}-2"
    assert manager.name_for(TRAIN, base) == base
    # without file ids the path says it, and the renamed session is not the new file's
    assert manager.notebook_session(Sender("Untitled.ipynb", "k-new")) == (None, "")
    assert manager.name_for(Sender("Untitled.ipynb", "k-new"), base) == f"{base}-2"


def test_a_notebook_goes_on_with_the_session_it_last_used_whoever_started_it() -> None:
    own, big = Stub("own", "train.ipynb", "id-train"), Stub("big", "other.ipynb", "id-other")
    manager = manager_with(own, big)
    assert manager.notebook_session(TRAIN) == (own, "")
    manager.attach("big", TRAIN)  # a turn on big
    assert manager.notebook_session(TRAIN) == (big, "")
    assert [n["path"] for n in big.notebooks.values()] == ["train.ipynb"]
    big.state = SessionState.STOPPED
    assert manager.notebook_session(TRAIN) == (own, "")


@pytest.mark.parametrize("file_id", ["id-train", ""])
def test_what_became_of_a_notebooks_session_is_said_to_that_notebook_only(file_id: str) -> None:
    import asyncio

    gone = Stub("gone", "train.ipynb", file_id)

    async def stop() -> None:
        return None

    gone.shutdown = stop  # type: ignore[attr-defined]
    manager = manager_with(gone)
    asyncio.run(manager.shutdown("gone", "session 'gone' was shut down from JupyterLab"))
    train = Sender("train.ipynb", "k", file_id)
    session, lost = manager.notebook_session(train)
    assert session is None and lost.startswith("session 'gone' was shut down from JupyterLab")
    assert manager.notebook_session(Sender("train.ipynb", "k2", "id-another")) == (None, "")
