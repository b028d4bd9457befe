"""A dial-back node's input: its owner's address, its credentials and the exec requests it
gets; each refusal names the bad value (never a key) and what was expected."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import asyncssh
import pytest

from jupyter_dist.node import pod_credentials
from jupyter_dist.node.dial_back import (
    agent_request,
    parse_address,
    parse_credentials,
    read_credentials,
)


def test_addresses() -> None:
    assert parse_address("10.0.0.1:4000") == ("10.0.0.1", 4000)
    assert parse_address("[fe80::1]:22") == ("fe80::1", 22)
    for bad in ("host", "host:", ":22", "host:0", "host:65536", "host:ssh"):
        with pytest.raises(ValueError, match=r"expected HOST:PORT \(port 1-65535\)"):
            parse_address(bad)


def test_requests_name_only_the_agent() -> None:
    assert agent_request('{"session": "train", "env": {"NODE_RANK": "1"}}') == (
        "train",
        {"NODE_RANK": "1"},
    )
    with pytest.raises(ValueError, match="no shell"):
        agent_request(None)
    with pytest.raises(ValueError, match=r"expected \{session, env\} as JSON"):
        agent_request("bash -i")
    with pytest.raises(ValueError, match=r"session 'a b': expected letters, digits, \. _ -"):
        agent_request('{"session": "a b"}')
    with pytest.raises(ValueError, match="env: expected an object of variable names"):
        agent_request('{"session": "s", "env": {"A=B": "1"}}')


def test_credentials_errors_never_show_a_key() -> None:
    key = asyncssh.generate_private_key("ssh-ed25519")
    secret = key.export_private_key().decode()
    good = {"node": 1, "host_key": secret, "client_key": key.export_public_key().decode()}
    creds = parse_credentials(json.dumps(good))
    assert creds.node == 1
    assert creds.host_key.public_data == key.public_data
    with pytest.raises(ValueError, match="not JSON") as err:
        parse_credentials(secret)
    assert secret.splitlines()[1] not in str(err.value)
    with pytest.raises(ValueError, match="client_key: missing or not an SSH key") as err:
        parse_credentials(json.dumps({**good, "client_key": secret[:-20]}))
    assert secret.splitlines()[1] not in str(err.value)
    with pytest.raises(ValueError, match="node -1: expected a node index"):
        parse_credentials(json.dumps({**good, "node": -1}))


def test_a_pods_init_container_hands_its_node_its_own_credentials_which_are_read_once(
    tmp_path: Path,
) -> None:
    """A Kubernetes pod: the Secret holds every node's credentials; the init container
    (`pod_credentials`) writes only this pod's node's, mode 0600, and the node reads them
    and removes the file before anything runs. No credentials come from the environment,
    and one node's never pass for another's."""
    keys = [asyncssh.generate_private_key("ssh-ed25519") for _ in range(3)]
    client = keys[0].export_public_key().decode()
    every = [
        {"node": n, "host_key": k.export_private_key().decode(), "client_key": client}
        for n, k in enumerate(keys)
    ]
    secret = tmp_path / "secret" / "credentials"
    secret.parent.mkdir()
    secret.write_text(json.dumps(every))
    mine = tmp_path / "node-key" / "credentials"
    mine.parent.mkdir()
    assert pod_credentials.main([str(secret), "--node", "1", "--to", str(mine)]) == 0
    assert stat.S_IMODE(mine.stat().st_mode) == 0o600
    held = json.loads(mine.read_text())
    assert held == every[1]  # node 1's alone: no other node's key
    creds = read_credentials(str(mine), node=1, remove=True)
    assert creds.node == 1 and creds.host_key.public_data == keys[1].public_data
    assert not mine.exists()  # read once, gone before any agent starts
    with pytest.raises(ValueError, match="No such file"):
        read_credentials(str(mine), node=1, remove=True)
    with pytest.raises(ValueError, match=r"credentials file .*No such file"):
        read_credentials("env", node=1)  # no longer a source
    with pytest.raises(ValueError, match="expected one node's"):
        parse_credentials(json.dumps(every), 1)
    with pytest.raises(ValueError, match="they are node 0's, not node 1's"):
        parse_credentials(json.dumps(every[0]), 1)


def test_the_init_container_names_what_is_missing_never_a_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = tmp_path / "credentials"
    secret.write_text(json.dumps([{"node": 0, "host_key": "PRIVATE KEY 0"}]))
    target = str(tmp_path / "out")
    assert pod_credentials.main([str(secret), "--node", "2", "--to", target]) == 2
    said = capsys.readouterr().err
    assert "node 2: 0 entries for it in the Secret (it has nodes 0); expected one" in said
    assert "PRIVATE" not in said
    # the Job controller did not set the index: the reference stays as written
    assert pod_credentials.main([str(secret), "--node", "$(JOB_COMPLETION_INDEX)", "--to",
                                 target]) == 2  # fmt: skip
    assert "--node '$(JOB_COMPLETION_INDEX)': expected the pod's completion index" in (
        capsys.readouterr().err
    )
    assert not os.path.exists(target)
