"""``%%distributed``'s arguments are parsed once a line, and every cell gets its own copy."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from jupyter_dist.common.hosts import HostSpec
from jupyter_dist.errors import SpecError
from jupyter_dist.notebook.magics import PARSED_LINES, DistMagics


def test_a_repeated_line_is_parsed_once_and_each_cell_gets_its_own_copy() -> None:
    magics = DistMagics(None)
    line = "--procs 2 --node-selector a=b --timeout 5"
    first = magics._cell_args(line)
    second = magics._cell_args(line)
    assert first == second and first is not second
    assert first.procs == "2" and first.timeout == 5.0 and first.node_selector == ["a=b"]
    first.node_selector.append("changed=here")  # a cell's changes stay its own
    assert magics._cell_args(line).node_selector == ["a=b"]
    assert magics._cell_args("").procs is None


def test_the_kept_lines_are_bounded() -> None:
    magics = DistMagics(None)
    for n in range(PARSED_LINES + 5):
        assert magics._cell_args(f"--procs {n}").procs == str(n)
    assert len(magics._parsed_lines) == PARSED_LINES


class _Manager:
    def __init__(self) -> None:
        self.sessions: dict[str, object] = {}
        self.heals: list[tuple[str, tuple[object, ...], object, bool]] = []

    async def heal(
        self, name: str, spares: tuple[object, ...] = (), auto: object = None, now: bool = True
    ) -> str:
        self.heals.append((name, spares, auto, now))
        return ""


class _Plane:
    def __init__(self) -> None:
        self.manager = _Manager()

    def run(self, coro: Any) -> Any:
        return asyncio.run(coro)


def test_slurm_nodes_the_session_does_not_use_wait_as_its_spares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n1,n2,n3,n4")
    plane = _Plane()
    magics = DistMagics(None, plane)  # type: ignore[arg-type]
    args = magics._cell_args("--slurm --nodes 2 --procs 1")
    request = magics._shape(args, "train")
    assert request.hosts == (HostSpec("n1"), HostSpec("n2")) and request.nodes is None
    magics._fault_policy("train", args)
    magics._fault_policy("train", args)  # said once
    assert plane.manager.heals == [("train", (HostSpec("n3"), HostSpec("n4")), None, False)]
    # every node of the allocation: no spares; more than it has: named
    assert magics._shape(magics._cell_args("--slurm --procs 1"), "all").hosts[3] == HostSpec("n4")
    with pytest.raises(SpecError, match=r"--nodes 5: the Slurm allocation has 4 node\(s\)"):
        magics._shape(magics._cell_args("--slurm --nodes 5 --procs 1"), "big")


@pytest.mark.parametrize(
    ("line", "said"),
    [
        # a Ray user's first guess: Kubernetes' --cpus, named as such, and Ray's own option
        (
            "--ray --cpus 4",
            "--cpus 4: --cpus is a Kubernetes option (--k8s: CPUs of each pod), and this "
            "session runs on Ray; with --ray use --ray-cpus 4 (the CPUs each node's Ray "
            "bundle holds)",
        ),
        (
            "--k8s --ray-cpus 2",
            "--ray-cpus 2: --ray-cpus is a Ray option (--ray: CPUs each node's Ray bundle "
            "holds), and this session runs on Kubernetes; with --k8s use --cpus 2",
        ),
        ("--ray --k8s-timeout 30", "with --ray use --ray-timeout 30"),
        ("--ray --memory 8Gi", "with --ray leave it out: a Ray bundle holds CPUs and GPUs"),
        ("--ray --namespace ml", "--namespace is a Kubernetes option (--k8s: the namespace"),
        ("--hosts a,b --ray-gpus 2", "and this session runs on SSH; with --hosts leave it out"),
        ("--slurm --cpus 3", "with --slurm use --procs P"),
        (
            "--ray --k8s",
            "--ray and --k8s: these choose 2 launchers, Ray and Kubernetes; a session runs on "
            "one: give one of them",
        ),
        ("--ray --hosts a,b", "--hosts and --ray: these choose 2 launchers, SSH and Ray"),
        (
            "--cpus 4 --ray-address h:1",
            "--cpus 4 and --ray-address h:1: --cpus is a Kubernetes option (--k8s), "
            "--ray-address a Ray one (--ray)",
        ),
    ],
)
def test_an_option_of_another_launcher_is_named_with_its_launcher_and_what_to_use(
    line: str, said: str
) -> None:
    magics = DistMagics(None, _Plane())  # type: ignore[arg-type]
    with pytest.raises(SpecError) as refused:
        magics._shape(magics._cell_args(f"{line} --procs 1"), "s")
    assert said in str(refused.value)


def test_each_launcher_takes_its_own_options() -> None:
    magics = DistMagics(None, _Plane())  # type: ignore[arg-type]
    ray = magics._shape(magics._cell_args("--ray --ray-cpus 4 --ray-timeout 30 --procs 1"), "s")
    assert ray.launcher == "ray" and ray.ray is not None and ray.ray.cpus == 4
    # --ray-timeout alone is Ray's, as every --ray-* option is
    alone = magics._shape(magics._cell_args("--ray-timeout 30 --procs 1"), "s")
    assert alone.launcher == "ray" and alone.ray is not None and alone.ray.timeout == 30
    k8s = magics._shape(magics._cell_args("--k8s --cpus 4 --memory 8Gi --procs 1"), "s")
    assert k8s.launcher == "k8s" and k8s.k8s is not None and k8s.k8s.cpus == "4"
