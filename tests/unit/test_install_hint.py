"""The advice a launcher adds when a node's Python cannot run the agent."""

from __future__ import annotations

from jupyter_dist._version import __version__
from jupyter_dist.control.launchers.base import AGENT_MODULE, install_hint, with_install_hint

# what ``python -m jupyter_dist.node`` prints where jupyter_dist is missing, and where an
# older jupyter_dist (which had ``jupyter_dist.agent``) is installed
MISSING = (
    "/usr/bin/python3: Error while finding module specification for 'jupyter_dist.node' "
    "(ModuleNotFoundError: No module named 'jupyter_dist')"
)
OLDER = "/usr/bin/python3: No module named jupyter_dist.node"


def test_a_missing_package_is_told_what_to_install() -> None:
    assert install_hint(MISSING) == (
        f"install jupyter_dist=={__version__} in that node's Python, or pass --python"
    )


def test_an_older_package_is_told_the_version() -> None:
    hint = install_hint(OLDER)
    assert hint is not None
    assert f"older than this notebook's {__version__}" in hint
    assert f"install jupyter_dist=={__version__} there" in hint


def test_other_failures_get_no_install_advice() -> None:
    assert install_hint("Permission denied (publickey)") is None
    assert install_hint("No module named 'jupyter_distx'") is None
    assert with_install_hint("boom") == "boom"
    assert with_install_hint(OLDER).startswith(OLDER + "\n(")


def test_the_agent_module_is_the_one_launchers_run() -> None:
    import importlib.util

    assert AGENT_MODULE == "jupyter_dist.node"
    assert importlib.util.find_spec(f"{AGENT_MODULE}.__main__") is not None
