"""Bad input end to end: through a real `jupyter server` process (JSON bodies and query
strings) and through the magic (arguments and hostfiles). Each bad value is refused with a
message naming it (a 400 JSON reply over REST), nothing starts, nothing is left behind, and
the server keeps answering other requests while it handles the bad one.

The parsers themselves: tests/unit/test_bad_input.py.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CellOutput, our_processes

from .server_process import API, Server, start_server, stop_server

pytestmark = pytest.mark.slow
#: seconds a GET /sessions may take while bad requests are handled (it takes milliseconds)
ANSWER_S = 1.5
#: a session on Kubernetes pods: refused for its k8s object before any cluster is asked
K8S = {"launcher": "k8s", "nodes": 2, "procs": 1}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("bad-input")
    running = start_server(root, root / "config")
    status, created = running.call("POST", f"{API}/sessions", {"name": "live", "procs": 1})
    assert status == 201, created
    yield running
    running.call("DELETE", f"{API}/sessions/live")
    stop_server(running)


def while_answering(server: Server, bad: Callable[[], Any]) -> Any:
    """``bad()``'s result; meanwhile GET /sessions is asked again and again, and must
    answer within `ANSWER_S` every time (the server's event loop is never held up)."""
    slowest = 0.0
    done = threading.Event()
    result: list[Any] = []

    def send_bad() -> None:
        try:
            for _ in range(5):  # the same bad request, a few times over
                result.append(bad())
        finally:
            done.set()

    sender = threading.Thread(target=send_bad)
    sender.start()
    while not done.is_set():
        began = time.monotonic()
        status, listed = server.call("GET", f"{API}/sessions")
        slowest = max(slowest, time.monotonic() - began)
        assert status == 200 and [s["name"] for s in listed] == ["live"], listed
    sender.join()
    assert slowest < ANSWER_S, f"GET /sessions took {slowest:.2f} s beside a bad request"
    assert len(set(map(repr, result))) == 1, result
    return result[0]


def nothing_left(server: Server, before: set[int]) -> None:
    status, listed = server.call("GET", f"{API}/sessions")
    assert status == 200 and [s["name"] for s in listed] == ["live"], listed
    assert {p.pid for p in server.descendants()} == before


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"procs": 10**12}, "at most 65536 ranks"),
        ({"procs": 5000}, "ranks may run on a node"),
        ({"gpus": [1] * 5000, "hosts": "a"}, "at most 1024 nodes"),
        ({"nodes": 10**12}, "at most 1024 nodes"),
        ({"hosts": [{"name": "a", "port": 99999}], "procs": 1}, "port 99999 of 'a'"),
        ({"hosts": [{"name": "a", "port": 0}], "procs": 1}, "port 0 of 'a'"),
        ({"hosts": [{"name": "a", "slots": -3}]}, "slots -3 of 'a'"),
        ({"hosts": [{"name": "a", "user": "-oProxyCommand=x"}], "procs": 1}, "starts with '-'"),
        ({"hosts": "-oProxyCommand=x", "procs": 1}, "host name '-oProxyCommand=x' starts"),
        ({"hosts": [{"name": "a", "python": "--version"}], "procs": 1}, "starts with '-'"),
        ({"procs": 1, "python": "--version"}, "python '--version' starts with '-'"),
        ({"procs": 1, "cwd": "/no/such/folder"}, "cwd '/no/such/folder': no such folder"),
        ({"procs": 1, "ssh_config": "/dev/zero"}, "ssh_config '/dev/zero': not a regular"),
        ({"procs": 1, "env": {"A B": "x"}}, "env: 'A B' is not a variable name"),
        ({"procs": "9" * 5000}, "procs: '9999"),
        ({**K8S, "k8s": {"namespace": "GPU_Team"}}, "k8s: --namespace 'GPU_Team': expected a"),
        (
            {**K8S, "k8s": {"memory": "64GB"}},
            "k8s: --memory '64GB': expected a Kubernetes quantity",
        ),
        ({**K8S, "k8s": {"namespce": "ml"}}, "k8s: unknown field 'namespce'; expected callback"),
        ({**K8S, "k8s": {"cpus": 8}}, "k8s.cpus: '8' is not a str"),
        ({**K8S, "k8s": {"cpus": "9" * 5000}}, "(5000 characters): expected a Kubernetes quantity"),
        ({**K8S, "hosts": "a,b", "k8s": {}}, "--k8s and --hosts/--hostfile: give one"),
        ({"procs": 1, "k8s": {"namespace": "ml"}}, "k8s options without --k8s"),
        ({**K8S, "k8s": {"pod_template": "/dev/zero"}}, "k8s: --pod-template '/dev/zero': not a"),
        ({**K8S, "k8s": {"pod_template": "/no/such/pod.yaml"}}, "No such file or directory"),
    ],
)
def test_bad_bodies_are_400s_naming_the_value(
    server: Server, body: dict[str, Any], fragment: str
) -> None:
    before = {p.pid for p in server.descendants()}
    status, reply = while_answering(
        server, lambda: server.call("POST", f"{API}/sessions", {"name": "bad", **body})
    )
    assert status == 400, reply
    assert reply["reason"] == "SpecError" and fragment in reply["message"], reply
    nothing_left(server, before)


#: five levels of aliases, each naming the one before ten times
ALIASES = (("a", "b"), ("b", "c"), ("c", "d"), ("d", "e"))
#: pod templates refused before anything is made, and the bound each names
POD_TEMPLATES = {
    "alias-bomb": (
        "metadata:\n  annotations:\n    a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
        + "".join(f"    {n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in ALIASES)
        + "spec: {}\n",
        "expands to more than 50000 values",
    ),
    "deep": ("spec: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested deeper than 32 levels"),
    "self": ("spec: &s\n  containers:\n  - env: [*s]\n", "refers to itself"),
    "command": (
        "spec:\n  containers:\n  - command: [sh, -c, env]\n",
        "spec.containers[0].command: the node's container runs",
    ),
}


@pytest.mark.parametrize("case", sorted(POD_TEMPLATES))
def test_a_pod_template_past_a_bound_is_a_400_naming_it(
    server: Server, tmp_path: Path, case: str
) -> None:
    """Read in a thread of the server: a deep one was a RecursionError, an HTTP 500; an
    alias bomb and a template that refers to itself passed."""
    text, fragment = POD_TEMPLATES[case]
    path = tmp_path / "pod.yaml"
    path.write_text(text)
    before = {p.pid for p in server.descendants()}
    body = {"name": "bad", **K8S, "k8s": {"pod_template": str(path)}}
    status, reply = while_answering(server, lambda: server.call("POST", f"{API}/sessions", body))
    assert status == 400, reply
    assert reply["message"].startswith(f"k8s: --pod-template {str(path)!r}: "), reply
    assert fragment in reply["message"], reply
    nothing_left(server, before)


@pytest.mark.parametrize(
    ("ranks", "fragment"),
    [
        ("0-30000000", "rank 30000000 does not exist; the session has ranks 0-0"),
        (",".join(["0-65535"] * 2000), "rank 65535 does not exist"),
        ("9" * 5000, "does not exist"),
        ("1-x", "'1-x' is not a rank or a range"),
    ],
)
def test_bad_ranks_in_a_query_string_are_400s(server: Server, ranks: str, fragment: str) -> None:
    before = {p.pid for p in server.descendants()}
    status, reply = while_answering(
        server, lambda: server.call("POST", f"{API}/sessions/live/stacks?ranks={ranks}", {})
    )
    assert status == 400, reply
    assert fragment in reply["message"], reply
    nothing_left(server, before)
    status, reply = server.call("POST", f"{API}/sessions/live/stacks?ranks=0", {})
    assert status == 200 and list(reply["stacks"]) == ["0"], reply


def test_stacks_are_no_longer_a_get(server: Server) -> None:
    assert server.call("GET", f"{API}/sessions/live/stacks")[0] == 405


# -- the magic -------------------------------------------------------------------------------------
@pytest.fixture
def hostfile(tmp_path: Path) -> Callable[[str], str]:
    def make(text: str) -> str:
        path = tmp_path / "hosts"
        path.write_text(text)
        return str(path)

    return make


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ("--timeout nan", "--timeout nan: expected a finite positive number"),
        ("--timeout inf", "--timeout inf: expected a finite positive number"),
        ("--ranks 0-30000000", "rank 30000000 does not exist"),
        ("--procs 1000000000000", "more ranks than any node runs"),
        ("--procs 100000", "at most 65536 ranks"),
        ("--procs 5000", "ranks may run on a node"),
        ("--nodes 100000", "at most 1024 nodes"),
        ("--hosts=-oProxyCommand=x", "host name '-oProxyCommand=x' starts with '-'"),
        ("--hosts=-l@gpu1", "user '-l' starts with '-'"),
        ("--hosts gpu1:0", "port 0 of 'gpu1:0'"),
        ("--hosts gpu1 --procs 1 --python=--version", "starts with '-'"),
        ("--hostfile /dev/zero", "not a regular file"),
        ("--hostfile {fifo}", "not a regular file"),
        ("--hostfile {dir}", "not a regular file"),
        ("--hostfile {hostfile:gpu1 python=--version}", "python '--version' starts with '-'"),
        ("--hostfile {hostfile:gpu1 slots=-3}", "expected slots=N"),
        ("--hostfile {hostfile:-oProxyCommand=x}", "starts with '-'"),
        ("--hostfile {big}", "expected at most 1048576 bytes"),
        ("--ssh-config /dev/zero --hosts gpu1 --procs 1", "--ssh-config '/dev/zero'"),
    ],
)
def test_bad_arguments_are_refused_and_start_nothing(
    run: Callable[[str], CellOutput],
    tmp_path: Path,
    hostfile: Callable[[str], str],
    args: str,
    fragment: str,
) -> None:
    from jupyter_dist.notebook.owners import embedded_owner

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    big.write_bytes(b"gpu1\n" * 300_000)
    if "{hostfile:" in args:
        head, _, rest = args.partition("{hostfile:")
        content, _, tail = rest.partition("}")
        args = f"{head}{hostfile(content + chr(10))}{tail}"
    args = args.format(fifo=fifo, dir=tmp_path, big=big)
    before = {p.pid for p in our_processes()}
    began = time.monotonic()
    out = run(f"%%distributed --session badinput {args}\nprint('ran')")
    assert time.monotonic() - began < 5
    assert not out.ok
    assert fragment in str(out.error), out.error
    assert "ran" not in out.stdout
    assert "badinput" not in embedded_owner().manager.sessions
    assert {p.pid for p in our_processes()} == before


@pytest.mark.parametrize("command", ["push", "pull"])
def test_push_and_pull_refuse_a_bad_timeout(run: Callable[[str], CellOutput], command: str) -> None:
    out = run(f"x = 1\n%dist {command} x --timeout nan")
    assert not out.ok
    assert "--timeout nan: expected a finite positive number" in str(out.error)
