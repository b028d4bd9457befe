"""A ``--k8s`` start against an API server that cannot be reached fails at once, naming the
server and where its address came from (the kubeconfig's context, ``--context``).

No cluster is needed: a kubeconfig whose server is a port nothing listens on (a socket
bound and closed), or one that accepts connections and never answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jupyter_dist.text import strip_ansi
from tests import dead_ports
from tests.conftest import CellOutput

pytestmark = [pytest.mark.slow]
pytest.importorskip("kr8s")

#: well past the start's bound (5 s for the server's first answer, plus reading the
#: kubeconfig), short of what it was (30 s, then a misleading "cannot use the context")
HANG_S = 60.0


def kubeconfig(path: Path, servers: dict[str, int], current: str) -> Path:
    """A kubeconfig with one context per server (a token, TLS not verified)."""
    clusters = "".join(
        f"- name: {name}\n  cluster:\n    server: https://127.0.0.1:{port}\n"
        "    insecure-skip-tls-verify: true\n"
        for name, port in servers.items()
    )
    contexts = "".join(
        f"- name: {name}\n  context:\n    cluster: {name}\n    user: u\n    namespace: ml\n"
        for name in servers
    )
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n{clusters}contexts:\n{contexts}current-context: {current}\n"
        "users:\n- name: u\n  user:\n    token: not-a-secret\n"
    )
    return path


@pytest.fixture
def silent_port() -> Iterator[int]:
    with dead_ports.silent_port("127.0.0.1") as port:
        yield port


def start_fails(run: Callable[[str], CellOutput], line: str) -> tuple[str, float]:
    began = time.monotonic()
    out = run(f"%%distributed --k8s {line} --nodes 1 --procs 1 --image a/b:1\nx = 1")
    took = time.monotonic() - began
    assert not out.ok
    return strip_ansi(out.stdout + out.stderr), took


def test_an_api_server_with_nothing_listening_is_named_with_the_kubeconfigs_context(
    run: Callable[[str], CellOutput], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = dead_ports.closed_port()
    config = kubeconfig(tmp_path / "config", {"lab": port}, "lab")
    monkeypatch.setenv("KUBECONFIG", str(config))
    text, took = start_fails(run, "--session kdead")
    assert took < HANG_S, f"{took:.0f} s: {text}"
    assert (
        f"AgentError: Kubernetes API server https://127.0.0.1:{port} (context 'lab' of the "
        f"kubeconfig {config}, its current context): cannot connect (ConnectError"
    ) in text, text
    assert "--context picks another" in text, text
    assert "kdead" not in run("%dist status").stdout


def test_an_api_server_that_never_answers_is_named_with_the_context_given(
    run: Callable[[str], CellOutput],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    silent_port: int,
) -> None:
    config = kubeconfig(
        tmp_path / "config", {"lab": dead_ports.closed_port(), "far": silent_port}, "lab"
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    text, took = start_fails(run, "--context far --session ksilent")
    assert took < HANG_S, f"{took:.0f} s: {text}"
    assert (
        f"Kubernetes API server https://127.0.0.1:{silent_port} (context 'far' of the "
        f"kubeconfig {config}, given by --context): no answer within 5 s"
    ) in text, text
    assert "ksilent" not in run("%dist status").stdout
