"""The agent's JSON-lines protocol and GPU visibility rules."""

from __future__ import annotations

import pytest

from jupyter_dist.common.agent_protocol import decode, describe_returncode, encode
from jupyter_dist.common.gpus import GPUInfo, _visible


def test_roundtrip() -> None:
    msg = {"op": "spawn", "rank": 1, "env": {"A": "b"}}
    assert decode(encode(msg)) == msg
    assert encode(msg).endswith(b"\n")


def test_decode_rejects_non_objects() -> None:
    with pytest.raises(ValueError, match="JSON object"):
        decode(b"[1]")


def test_describe_returncode() -> None:
    assert describe_returncode(-9) == "killed by signal SIGKILL (9)"
    assert describe_returncode(3) == "exit code 3"


def test_cuda_visible_devices() -> None:
    devices = [GPUInfo(i, "H100", 80000, f"GPU-{i}abc") for i in range(4)]
    assert [d.uuid for d in _visible(devices, "2,0")] == ["GPU-2abc", "GPU-0abc"]
    assert [d.index for d in _visible(devices, "2,0")] == [0, 1]
    assert _visible(devices, "") == []
    assert len(_visible(devices, "1,9,2")) == 1  # CUDA stops at an invalid entry
    assert _visible(devices, None) == devices
