"""Renames of notebooks and folders, followed: `control.notebook_paths`."""

from __future__ import annotations

from jupyter_dist.control.notebook_paths import MAX_RENAMES, NotebookPaths, moved


def test_moved_follows_a_file_or_a_folder_and_nothing_else() -> None:
    assert moved("Untitled.ipynb", "Untitled.ipynb", "train.ipynb") == "train.ipynb"
    assert moved("runs/a.ipynb", "runs", "old/runs") == "old/runs/a.ipynb"
    assert moved("runs2/a.ipynb", "runs", "x") is None  # a prefix is not a folder
    assert moved("other.ipynb", "Untitled.ipynb", "train.ipynb") is None
    assert moved("", "", "x") is None


def test_a_kernel_naming_an_old_path_is_understood_after_several_renames() -> None:
    paths = NotebookPaths()
    paths.rename("Untitled.ipynb", "train.ipynb")
    paths.rename("/train.ipynb", "runs/train.ipynb")  # the contents API strips slashes
    paths.rename("runs", "done")
    for old in ("Untitled.ipynb", "train.ipynb", "runs/train.ipynb", "done/train.ipynb"):
        assert paths.current(old) == "done/train.ipynb", old
    assert paths.current("elsewhere.ipynb") == "elsewhere.ipynb"
    assert paths.current("") == ""


def test_renamed_back_is_the_first_name_again() -> None:
    paths = NotebookPaths()
    paths.rename("a.ipynb", "b.ipynb")
    paths.rename("b.ipynb", "a.ipynb")
    assert paths.current("a.ipynb") == "a.ipynb"
    assert paths.current("b.ipynb") == "a.ipynb"
    assert "a.ipynb" not in paths.renamed


def test_what_became_of_a_session_moves_with_its_notebook_and_both_stay_bounded() -> None:
    paths = NotebookPaths()
    paths.note_lost("a.ipynb", "session 'a-123456' was shut down")
    paths.rename("a.ipynb", "b.ipynb")
    assert paths.lost == {"b.ipynb": "session 'a-123456' was shut down"}
    for i in range(MAX_RENAMES + 10):
        paths.rename(f"n{i}.ipynb", f"m{i}.ipynb")
    assert len(paths.renamed) == MAX_RENAMES
    assert paths.current(f"n{MAX_RENAMES + 9}.ipynb") == f"m{MAX_RENAMES + 9}.ipynb"


def test_a_session_request_names_its_notebook_or_is_refused_saying_why() -> None:
    import pytest

    from jupyter_dist.errors import SpecError
    from jupyter_dist.server.handlers import shape_from_json

    assert shape_from_json({"name": "a", "notebook": "/runs/a.ipynb"}).notebook == "runs/a.ipynb"
    assert shape_from_json({"name": "a"}).notebook == ""
    with pytest.raises(SpecError, match=r"notebook 'a\\nb': expected a notebook's path"):
        shape_from_json({"name": "a", "notebook": "a\nb"})
    with pytest.raises(SpecError, match="notebook: '3' is not a str"):
        shape_from_json({"name": "a", "notebook": 3})
