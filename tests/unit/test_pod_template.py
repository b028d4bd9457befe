"""``--pod-template`` read with bounds: a file that expands (an alias bomb), nests or refers
to itself past a bound is refused naming the bound, before anything is built from it; a
template may not give the node's container a command, nor touch the volumes that carry
the nodes' credentials. Through a server: tests/integration/test_bad_input.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_dist.common import pod_template as pt
from jupyter_dist.common.k8s_options import read_pod_template
from jupyter_dist.errors import SpecError

#: five levels of aliases, each naming the one before ten times: 100,000 "lol"s (what the
#: audit sent: under 300 bytes that became 5.8 MB of Job)
ALIAS_BOMB = (
    "metadata:\n  annotations:\n"
    '    a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + "".join(
        f"    {n}: &{n} [{','.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcd", "bcde", strict=True)
    )
    + "spec: {}\n"
)


def refusal(tmp_path: Path, text: str) -> str:
    path = tmp_path / "pod.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        read_pod_template(str(path))
    message = str(err.value)
    assert message.startswith(f"--pod-template {str(path)!r}: "), message
    return message


def test_an_alias_bomb_is_refused_naming_the_bound(tmp_path: Path) -> None:
    assert len(ALIAS_BOMB) < 400
    said = refusal(tmp_path, ALIAS_BOMB)
    assert f"expands to more than {pt.MAX_TEMPLATE_NODES} values" in said, said
    assert "an alias counts what it names each time" in said and "*d, line 7" in said, said
    # a few long texts named many times: bounded by the text they expand to
    long = "spec:\n  a: &a '" + "x" * 200_000 + "'\n  b: [*a, *a, *a, *a, *a, *a]\n"
    said = refusal(tmp_path, long)
    assert f"expands to more than {pt.MAX_TEMPLATE_EXPANDED_BYTES // 1024} KiB of text" in said


@pytest.mark.parametrize(
    "text",
    [
        "spec: " + "[" * 100_000 + "]" * 100_000 + "\n",  # flow: Python's recursion ran out
        "spec:\n" + "".join(" " * (n + 1) + f"k{n}:\n" for n in range(100)) + " " * 101 + "x: 1\n",
        "spec: " + "{a: " * 40 + "1" + "}" * 40 + "\n",
    ],
    ids=["flow-100000", "block-100", "mapping-40"],
)
def test_a_deeply_nested_template_is_refused_naming_the_bound(tmp_path: Path, text: str) -> None:
    said = refusal(tmp_path, text)
    assert f"nested deeper than {pt.MAX_TEMPLATE_DEPTH} levels" in said, said


def test_a_template_that_refers_to_itself_is_refused(tmp_path: Path) -> None:
    said = refusal(tmp_path, "spec: &pod\n  containers:\n  - name: a\n    env: [*pod]\n")
    assert "alias *pod (line 4) is inside the node &pod names" in said, said
    assert "refers to itself" in said


def test_aliases_merges_and_dates_within_the_bounds_read_as_json(tmp_path: Path) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(
        "metadata:\n  annotations: {made: 2024-01-01}\n"
        "spec:\n"
        "  tolerations:\n  - &gpu {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}\n"
        "  - {<<: *gpu, effect: NoExecute}\n"
    )
    assert read_pod_template(str(path)) == {
        "metadata": {"annotations": {"made": "2024-01-01"}},  # as kubectl reads it: text
        "spec": {
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"},
            ]
        },
    }
    said = refusal(tmp_path, "metadata:\n  annotations: {blob: !!binary aGk=}\n")
    assert "metadata.annotations.blob: a bytes; expected text, a number" in said, said
    said = refusal(tmp_path, "spec:\n  priority: .inf\n")
    assert "spec.priority: inf; expected a finite number" in said, said


@pytest.mark.parametrize("field", ["command", "args"])
def test_a_command_for_the_node_container_is_refused_saying_what_to_do(
    tmp_path: Path, field: str
) -> None:
    """A debugging ``sh -c env`` was put in front of the node's command (and printed every
    node's key into the pod log); it is refused, naming the field and what to use."""
    said = refusal(tmp_path, f"spec:\n  containers:\n  - name: debug\n    {field}: [sh, -c, env]\n")
    assert f"spec.containers[0].{field}: the node's container runs jupyter_dist's" in said
    assert "initContainer" in said and "Remove it" in said, said


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "spec:\n  containers:\n  - volumeMounts: [{name: jupyter-dist-credentials, "
            "mountPath: /k}]\n",
            "spec.containers[0].volumeMounts: volume 'jupyter-dist-credentials' holds",
        ),
        (
            "spec:\n  initContainers:\n  - name: peek\n    image: busybox\n    volumeMounts: "
            "[{name: jupyter-dist-node-key, mountPath: /k}]\n",
            "spec.initContainers[0].volumeMounts: volume 'jupyter-dist-node-key' holds",
        ),
        (
            "spec:\n  initContainers:\n  - name: peek\n    image: busybox\n    volumeMounts: "
            "[{name: mine, mountPath: /var/run/jupyter-dist/node-key/}]\n",
            "mountPath '/var/run/jupyter-dist/node-key/' is in /var/run/jupyter-dist/node-key",
        ),
        (
            "spec:\n  volumes: [{name: jupyter-dist-credentials, emptyDir: {}}]\n",
            "spec.volumes: 'jupyter-dist-credentials' is jupyter_dist's",
        ),
        (
            "spec:\n  initContainers: [{name: jupyter-dist-keys, image: busybox}]\n",
            "spec.initContainers[0].name 'jupyter-dist-keys' is jupyter_dist's",
        ),
    ],
    ids=["mount-secret", "mount-key-dir", "path-under-key-dir", "volume-name", "init-name"],
)
def test_a_template_may_not_touch_the_nodes_credentials(
    tmp_path: Path, text: str, said: str
) -> None:
    message = refusal(tmp_path, text)
    assert said in message, message
