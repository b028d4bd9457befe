"""Which ``%%distributed`` options belong to which launcher, and the refusal of one given
with another launcher.

``--cpus`` is Kubernetes' (each pod's CPUs); a Ray user who writes ``--ray --cpus 4``
means ``--ray-cpus 4``. `check_launcher_options` refuses an option of one launcher given
with another, naming the option, the launcher it belongs to and, where there is one, what
to use instead (`INSTEAD`); and two launchers chosen at once, naming both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jupyter_dist.common.bounded import cut
from jupyter_dist.errors import SpecError

#: each launcher as people call it, and the flag that chooses it
LAUNCHER_NAMES: dict[str, str] = {
    "ray": "Ray",
    "k8s": "Kubernetes",
    "ssh": "SSH",
    "slurm": "Slurm",
}
LAUNCHER_FLAGS: dict[str, str] = {
    "ray": "--ray",
    "k8s": "--k8s",
    "ssh": "--hosts or --hostfile",
    "slurm": "--slurm",
}

#: each launcher's own options, and what each is for
OPTIONS: dict[str, dict[str, str]] = {
    "ray": {
        "--ray-address": "the Ray cluster's address",
        "--ray-strategy": "how the nodes' Ray bundles are placed",
        "--ray-runtime-env": "Ray's runtime environment of the node actors",
        "--ray-cpus": "CPUs each node's Ray bundle holds",
        "--ray-gpus": "GPUs each node's Ray bundle holds",
        "--ray-timeout": "seconds to wait for the Ray cluster to have room",
        "--ray-resources": "custom resources and accelerator type each node's Ray bundle holds",
    },
    "k8s": {
        "--namespace": "the namespace of the pods",
        "--context": "the kubeconfig context",
        "--image": "the pods' image",
        "--cpus": "CPUs of each pod",
        "--memory": "memory of each pod",
        "--node-selector": "a label the pods' machines must have",
        "--toleration": "a taint the pods tolerate",
        "--pod-template": "a pod template for the pods",
        "--k8s-callback": "the address the pods dial back to",
        "--k8s-timeout": "seconds to wait for the pods",
        "--k8s-deadline": "seconds the session's Job may live",
        "--k8s-grace": "seconds a pod keeps dialling a notebook it lost",
        "--k8s-queue": "the Kueue queue that admits the session's pods",
        "--k8s-queue-timeout": "seconds the session may wait in its Kueue queue",
        "--k8s-gang-timeout": "seconds for every pod to be on a machine",
        "--k8s-priority-class": "the pods' priority class",
        "--k8s-scheduler": "the scheduler that places the pods",
        "--k8s-gpu-resource": "the resource each pod's GPUs are asked as",
    },
}

#: (an option, the launcher it is given with) -> what to do with that launcher instead;
#: VALUE stands for the value given
INSTEAD: dict[tuple[str, str], str] = {
    ("--cpus", "ray"): "use --ray-cpus VALUE (the CPUs each node's Ray bundle holds)",
    ("--memory", "ray"): (
        "leave it out: a Ray bundle holds CPUs and GPUs (--ray-cpus, --ray-gpus), the "
        "memory is its Ray node's"
    ),
    ("--image", "ray"): (
        'use --ray-runtime-env \'{"image_uri": "VALUE"}\' (Ray\'s runtime environment), or '
        "a cluster whose nodes have jupyter_dist"
    ),
    ("--k8s-timeout", "ray"): "use --ray-timeout VALUE",
    ("--context", "ray"): "use --ray-address HOST:PORT (the cluster's GCS address)",
    ("--ray-cpus", "k8s"): "use --cpus VALUE (each pod's CPUs, e.g. 8 or 500m)",
    ("--ray-gpus", "k8s"): "use --gpus N (each pod gets the GPUs its ranks use)",
    ("--ray-timeout", "k8s"): "use --k8s-timeout VALUE",
    ("--ray-runtime-env", "k8s"): "use --image (one with what the ranks need) or --pod-template",
    ("--ray-address", "k8s"): "use --context (a kubeconfig context) to name the cluster",
    ("--ray-resources", "k8s"): "use --pod-template (the pods' resources and node affinity)",
    ("--cpus", "ssh"): "use --procs P (CPU ranks per node)",
    ("--cpus", "slurm"): "use --procs P (CPU ranks per node); the allocation holds the CPUs",
}


@dataclass(frozen=True)
class GivenOption:
    """An option given in the cell's line, with its value as written (None: a switch), cut
    short where it is long (a refusal repeats it)."""

    flag: str
    value: str | None = None

    def __str__(self) -> str:
        return self.flag if self.value is None else f"{self.flag} {self.value}"


def owner_of(flag: str) -> str | None:
    """The launcher ``flag`` belongs to, or None for one every launcher takes."""
    return next((kind for kind, options in OPTIONS.items() if flag in options), None)


def given_options(values: Mapping[str, object]) -> list[GivenOption]:
    """The launchers' options among an argparse namespace's ``values`` (by dest name)
    that were given: not None, not empty."""
    found = []
    for options in OPTIONS.values():
        for flag in options:
            value = values.get(flag[2:].replace("-", "_"))
            if value is None or value == [] or value is False:
                continue
            shown = ",".join(map(str, value)) if isinstance(value, list) else str(value)
            found.append(GivenOption(flag, cut(shown)))
    return found


def check_launcher_options(chosen: Sequence[tuple[str, str]], given: Sequence[GivenOption]) -> None:
    """Refuse two launchers at once, or an option of one launcher with another.

    ``chosen``: the launchers the line chose, each as (kind, the flag written: ``--ray``,
    ``--hosts``...); ``given``: the launchers' options it gives (`given_options`). With no
    launcher chosen, options of two launchers are refused too (each implies its own).
    """
    if len(chosen) > 1:
        flags = " and ".join(flag for _, flag in chosen)
        kinds = " and ".join(LAUNCHER_NAMES[kind] for kind, _ in chosen)
        raise SpecError(
            f"{flags}: these choose {len(chosen)} launchers, {kinds}; a session runs on one: "
            "give one of them"
        )
    if chosen:
        launcher, flag = chosen[0]
        for option in given:
            owner = owner_of(option.flag)
            if owner is not None and owner != launcher:
                raise SpecError(_foreign(option, owner, launcher, flag))
        return
    owners = {owner_of(o.flag): o for o in given}
    if len(owners) > 1:
        (first, one), (second, other) = sorted(owners.items(), key=lambda kv: str(kv[0]))
        raise SpecError(
            f"{one} and {other}: {one.flag} is a {LAUNCHER_NAMES[str(first)]} option "
            f"({LAUNCHER_FLAGS[str(first)]}), {other.flag} a {LAUNCHER_NAMES[str(second)]} one "
            f"({LAUNCHER_FLAGS[str(second)]}); a session runs on one launcher: give the "
            "options of one"
        )


def _foreign(option: GivenOption, owner: str, launcher: str, flag: str) -> str:
    """``--cpus 4`` with ``--ray``: whose option it is, and what Ray uses instead."""
    what = OPTIONS[owner][option.flag]
    told = (
        f"{option}: {option.flag} is a {LAUNCHER_NAMES[owner]} option ({LAUNCHER_FLAGS[owner]}: "
        f"{what}), and this session runs on {LAUNCHER_NAMES[launcher]}"
    )
    instead = INSTEAD.get((option.flag, launcher), "leave it out")
    return f"{told}; with {flag} {instead.replace('VALUE', option.value or 'N')}"


__all__ = [
    "INSTEAD",
    "LAUNCHER_FLAGS",
    "LAUNCHER_NAMES",
    "OPTIONS",
    "GivenOption",
    "check_launcher_options",
    "given_options",
    "owner_of",
]
