"""The wheel carries the prebuilt JupyterLab sidebar: installed where there is no Node and
no source tree, JupyterLab lists it enabled."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parents[2]
LABEXT = "share/jupyter/labextensions/jupyter-dist-labextension"


def test_the_wheel_ships_the_sidebar_and_lab_lists_it(tmp_path: Path) -> None:
    if not (ROOT / "jupyter_dist" / "labextension" / "package.json").exists():
        pytest.fail("the sidebar is not built: run `make setup`")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = tmp_path.glob("jupyter_dist-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    data = [n.split(".data/data/", 1)[1] for n in names if ".data/data/" in n]
    assert f"{LABEXT}/package.json" in data
    assert f"{LABEXT}/install.json" in data
    assert any(n.startswith(f"{LABEXT}/static/remoteEntry.") for n in data), data
    assert f"{LABEXT}/schemas/jupyter-dist-labextension/plugin.json" in data
    # its data files unpacked into a prefix of its own, as an installer puts them (pip
    # itself would uninstall this environment's copy first), with no Node on the path
    prefix = tmp_path / "prefix"
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if ".data/data/" in member and not member.endswith("/"):
                target = prefix / member.split(".data/data/", 1)[1]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(member))
    env = {
        **os.environ,
        "JUPYTER_PATH": str(prefix / "share" / "jupyter"),
        "PATH": str(Path(sys.executable).parent),  # jupyter, and no node
    }
    listed = subprocess.run(
        [str(Path(sys.executable).parent / "jupyter"), "labextension", "list"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    text = listed.stdout + listed.stderr
    section = text.split(str(prefix / "share" / "jupyter" / "labextensions"), 1)
    assert len(section) == 2, text
    first = section[1].strip().splitlines()[0]
    assert "jupyter-dist-labextension" in first and "enabled" in first and "OK" in first, text
