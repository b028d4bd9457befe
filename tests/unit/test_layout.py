"""The package's layout is its architecture: imports go down, and every module path
written as a string resolves.

Roles, bottom up (ARCHITECTURE.md draws them): the base (``errors``, ``settings``,
``text``, ``_version``), ``common``, then the roles that each run in one place. A role may
import the base, ``common`` and the roles listed for it below, nothing else; the package's
``__init__`` (the public surface and the Jupyter hooks) may import anything, lazily.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "jupyter_dist"
BASE = {"errors", "settings", "text", "_version"}
#: what each role may import besides the base, common and itself
MAY_IMPORT: dict[str, set[str]] = {
    "base": set(),
    "common": set(),
    "rank": set(),
    "node": {"rank"},
    "control": set(),
    "server": {"control"},
    "server_client": {"control"},
    "display": set(),
    "notebook": {"control", "server_client", "display"},
}
#: roles that must not import these third-party packages at module level
FORBIDDEN_AT_IMPORT: dict[str, tuple[str, ...]] = {
    "base": ("IPython", "ipykernel", "tornado", "jupyter_server", "ipywidgets", "torch"),
    "common": ("IPython", "ipykernel", "tornado", "jupyter_server", "ipywidgets", "torch"),
    "control": ("IPython", "ipykernel", "tornado", "jupyter_server", "ipywidgets", "bqplot", "ray"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def role(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "top"
    return "base" if parts[1] in BASE else parts[1]


def imports(path: Path, top_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, module) of every import in the file; names imported from a package count
    as their submodule when they are one."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: list[tuple[int, str]] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = [f"{node.module}.{alias.name}" for alias in node.names]
            submodules = [s for s in submodules if s.startswith("jupyter_dist") and _is_module(s)]
            if len(submodules) < len(node.names):  # some names are the module's attributes
                found.append((node.lineno, node.module))
            found += [(node.lineno, s) for s in submodules]
    return found


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT / rel.with_suffix(".py")).exists() or (ROOT / rel / "__init__.py").exists()


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_belongs_to_a_known_role() -> None:
    unknown = {role(module_name(p)) for p in MODULES} - {*MAY_IMPORT, "top"}
    assert not unknown, f"folders with no place in the layering: {unknown}"


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_imports_go_down(path: Path) -> None:
    mine = role(module_name(path))
    if mine == "top":
        return
    # the base sits under everything, common included
    allowed = {"base"} if mine == "base" else {"base", "common", mine, *MAY_IMPORT[mine]}
    wrong = [
        f"line {line}: {target} ({role(target)})"
        for line, target in imports(path)
        if target.startswith("jupyter_dist") and role(target) not in allowed
    ]
    assert not wrong, f"{module_name(path)} ({mine}) imports upward or sideways: {wrong}"


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_light_roles_import_no_heavy_packages(path: Path) -> None:
    forbidden = FORBIDDEN_AT_IMPORT.get(role(module_name(path)), ())
    heavy = [
        f"line {line}: {target}"
        for line, target in imports(path, top_level_only=True)
        if target.split(".")[0] in forbidden
    ]
    assert not heavy, f"{module_name(path)} imports at module level: {heavy}"


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The rule has teeth: a control-plane module importing the notebook side is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("from jupyter_dist.notebook.magics import DistMagics\n")
    targets = [t for _, t in imports(bad)]
    assert role("jupyter_dist.control.bad") == "control"
    assert any(role(t) not in {"base", "common", "control"} for t in targets)


# -- module paths written as strings -------------------------------------------------------

_DOTTED = re.compile(r"""["'`](jupyter_dist(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?::([A-Za-z_]\w*))?""")
#: strings that look like module paths but are names on the wire or public group names
NOT_MODULES = {"jupyter_dist.objects", "jupyter_dist.launchers"}


def _resolve(dotted: str, attr: str | None) -> None:
    """Import the longest importable prefix of ``dotted`` and walk the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in [*parts[cut:], *([attr] if attr else [])]:
            obj = getattr(obj, name)
        return
    raise AssertionError(f"{dotted!r} names no module")


def string_paths() -> list[tuple[str, str, str | None]]:
    found = []
    for path in MODULES:
        for match in _DOTTED.finditer(path.read_text(encoding="utf-8")):
            if match.group(1) not in NOT_MODULES:
                found.append((module_name(path), match.group(1), match.group(2)))
    return found


def test_strings_naming_modules_resolve() -> None:
    """The out-stream class given to ipykernel, the agent's preload list, launch lines,
    the lazy table, code strings run on ranks: every dotted path in a string imports."""
    paths = string_paths()
    assert len(paths) > 10, paths  # the scan finds them (preloads, lazy table, launch lines)
    bad = []
    for where, dotted, attr in paths:
        try:
            _resolve(dotted, attr)
        except (AssertionError, AttributeError, ImportError) as err:
            bad.append(f"{where}: {dotted}{':' + attr if attr else ''} ({err})")
    assert not bad, bad


def test_public_names_resolve() -> None:
    import jupyter_dist

    for name in jupyter_dist.__all__:
        assert getattr(jupyter_dist, name) is not None, name
    for point in jupyter_dist._jupyter_server_extension_points():
        importlib.import_module(point["module"])


def test_pyproject_paths_resolve() -> None:
    """Entry points and mypy overrides name modules that exist."""
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    points = meta["project"]["entry-points"]["jupyter_dist.launchers"]
    for target in points.values():
        module, _, attr = target.partition(":")
        _resolve(module, attr)
    for override in meta["tool"]["mypy"]["overrides"]:
        for module in override["module"]:
            if module.startswith("jupyter_dist"):
                assert _is_module(module), f"mypy override names no module: {module}"


def test_launch_line_runs_the_node_package() -> None:
    """Launchers run ``python -m jupyter_dist.node``: the package must be runnable."""
    import jupyter_dist.node.__main__ as entry

    assert callable(entry.main)


def test_environment_variables_are_defined_in_settings_alone() -> None:
    """Every ``JUPYTER_DIST_*`` variable is named in ``settings`` and nowhere else in code
    (docstrings may mention them)."""
    from jupyter_dist import settings

    pattern = re.compile(r"""["'](JUPYTER_DIST_[A-Z0-9_]+)["']""")
    elsewhere = {
        f"{module_name(path)}: {name}"
        for path in MODULES
        if path.name != "settings.py"
        for name in pattern.findall(path.read_text(encoding="utf-8"))
    }
    assert not elsewhere, elsewhere
    documented = (settings.__doc__ or "").count("JUPYTER_DIST_")
    assert set(pattern.findall(Path(settings.__file__).read_text())) == set(settings.ALL_VARS)
    assert documented >= len(settings.ALL_VARS)
