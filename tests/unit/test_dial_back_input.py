"""A dial-back node's input: its owner's address, its credentials and the exec requests it
gets; each refusal names the bad value (never a key) and what was expected."""

from __future__ import annotations

import json

import asyncssh
import pytest

from jupyter_dist.node.dial_back import agent_request, parse_address, parse_credentials


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


def test_every_nodes_credentials_from_the_environment_pick_this_one_and_leave_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Kubernetes pod's keys: the Secret's list of every node's, in the environment;
    ``--node`` picks its own, and the variable is gone before any agent starts."""
    import os

    from jupyter_dist.node.dial_back import read_credentials
    from jupyter_dist.settings import NODE_CREDENTIALS_VAR

    keys = [asyncssh.generate_private_key("ssh-ed25519") for _ in range(2)]
    client = keys[0].export_public_key().decode()
    every = [
        {"node": n, "host_key": k.export_private_key().decode(), "client_key": client}
        for n, k in enumerate(keys)
    ]
    monkeypatch.setenv(NODE_CREDENTIALS_VAR, json.dumps(every))
    mine = read_credentials("env", node=1)
    assert mine.node == 1 and mine.host_key.public_data == keys[1].public_data
    assert NODE_CREDENTIALS_VAR not in os.environ
    with pytest.raises(ValueError, match=f"{NODE_CREDENTIALS_VAR} is not set"):
        read_credentials("env", node=1)
    with pytest.raises(ValueError, match="expected --node N"):
        parse_credentials(json.dumps(every))
    with pytest.raises(ValueError, match="node 5: expected one entry for it among 2"):
        parse_credentials(json.dumps(every), 5)
    with pytest.raises(ValueError, match="they are node 0's, not node 1's"):
        parse_credentials(json.dumps(every[0]), 1)
