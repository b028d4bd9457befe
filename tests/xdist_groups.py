"""Which tests run together on one pytest-xdist worker (``make test``: ``-n N --dist
loadscope``), and in which order the groups are handed out.

A group runs on one worker, its tests in collection order, as they would without xdist:

* a folder whose tests share a cluster or a server started once per run (``SHARED_FOLDERS``:
  the Ray cluster, the SSH nodes, Slurm, JupyterLab with Chromium) is one group, so each is
  started once in the run;
* every other test is grouped with its module, so a module's fixtures (a session of rank
  kernels, a jupyter server, an emulated Kubernetes cluster) are made once, and tests that
  follow one another in a module still do.

The group is read off the test's id, on the controller, by the scheduler this plugin gives
xdist (``GroupScheduling``); xdist's own ``xdist_group`` marks are not used (they rename
test ids, which pytest 9.2 no longer lets a plugin do).

Groups are handed out longest first (``GROUP_WEIGHTS``: the seconds of the groups that
take minutes, from the timing summary of a full run; others by their number of tests), so
that no long group starts last while the other workers idle.
"""

from __future__ import annotations

from typing import Any

import pytest

#: folder -> the group of all its tests: they share a session-scoped cluster or server
SHARED_FOLDERS: dict[str, str] = {
    "tests/ray": "ray-cluster",
    "tests/multinode": "ssh-nodes",
    "tests/slurm": "slurm-cluster",
    "tests/browser": "jupyterlab",
}

#: the groups that take minutes, with their seconds as `make test` runs them (the timing
#: summary's numbers; a hint for the order only, so a stale one costs little)
GROUP_WEIGHTS: dict[str, float] = {
    "ray-cluster": 500,
    "ssh-nodes": 380,
    "jupyterlab": 300,
    "tests/integration/test_binder.py": 230,
    "tests/integration/test_notebooks.py": 110,
}
#: a group not in GROUP_WEIGHTS counts this many seconds a test; a unit test less
SECONDS_PER_TEST = 3.0
SECONDS_PER_UNIT_TEST = 0.05


def group_of(nodeid: str) -> str:
    """The group of the test ``nodeid``: its folder's if shared, else its module's path."""
    module = nodeid.split("::", 1)[0]
    folder = module.rsplit("/", 1)[0]
    return SHARED_FOLDERS.get(folder, module)


def longest_first(groups: list[str], weights: dict[str, float]) -> list[int]:
    """The indices of ``groups`` (one group a test) ordered group by group, the heaviest
    group first (``weights``, else ``SECONDS_PER_TEST`` a test), each group's tests in
    their order; groups of equal weight in the order they first appear."""
    weight: dict[str, float] = {}
    for group in groups:
        each = SECONDS_PER_UNIT_TEST if group.startswith("tests/unit/") else SECONDS_PER_TEST
        weight[group] = weight.get(group, 0.0) + each
    weight.update({g: w for g, w in weights.items() if g in weight})
    first_seen = {group: i for i, group in reversed(list(enumerate(groups)))}
    rank = {g: r for r, g in enumerate(sorted(weight, key=lambda g: (-weight[g], first_seen[g])))}
    return sorted(range(len(groups)), key=lambda i: rank[groups[i]])


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # on an xdist worker: the controller hands the groups out in the order collected
    if hasattr(config, "workerinput"):
        order = longest_first([group_of(item.nodeid) for item in items], GROUP_WEIGHTS)
        items[:] = [items[i] for i in order]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``--dist loadscope``: xdist's scope scheduling, with `group_of` as the scope
    and the groups in the workers' order (not re-sorted by their number of tests)."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False
    return GroupScheduling(config, log)
