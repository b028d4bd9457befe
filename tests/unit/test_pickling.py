"""Serialisation of pushed and pulled objects."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from jupyter_dist.common.pickling import dump, load
from jupyter_dist.errors import PushError


def roundtrip(obj: object) -> object:
    payload = dump(obj)
    return load(payload.frames, payload.digest, payload.sizes)


def test_notebook_defined_function_and_class_travel() -> None:
    namespace: dict[str, object] = {}
    exec("def double(x):\n    return 2 * x\nclass Box:\n    v = 3\n", namespace)
    back = roundtrip({"double": namespace["double"], "Box": namespace["Box"]})
    assert isinstance(back, dict)
    assert back["double"](21) == 42
    assert back["Box"].v == 3


def test_arrays_go_out_of_band_and_come_back_writable() -> None:
    array = np.arange(1_000_000, dtype=np.float32)
    payload = dump({"a": array})
    assert len(payload.frames) == 2
    assert payload.frames[1].nbytes == array.nbytes
    back = load(payload.frames, payload.digest, payload.sizes)["a"]
    np.testing.assert_array_equal(back, array)
    back[0] = 5.0  # writable


def test_cpu_tensors_go_out_of_band() -> None:
    tensor = torch.arange(100_000, dtype=torch.float64)
    payload = dump(tensor)
    assert len(payload.frames) == 2
    back = load(payload.frames, payload.digest, payload.sizes)
    assert isinstance(back, torch.Tensor)
    assert torch.equal(back, tensor)
    back.add_(1)  # writable, no warning


def test_bfloat16_tensors_still_travel() -> None:
    tensor = torch.ones(10, dtype=torch.bfloat16)
    assert torch.equal(roundtrip(tensor), tensor)  # type: ignore[arg-type]


def test_tampered_pickle_stream_is_refused_before_unpickling() -> None:
    payload = dump({"a": np.zeros(1000)})
    frames = list(payload.frames)
    evil = bytearray(frames[0])
    evil[-2] ^= 1
    frames[0] = bytes(evil)
    with pytest.raises(PushError, match="pickle stream does not match its signed digest"):
        load(frames, payload.digest, payload.sizes)


def test_frames_must_have_the_signed_sizes() -> None:
    payload = dump({"a": np.zeros(1000)})
    frames = list(payload.frames)
    frames[1] = bytes(len(frames[1]) - 8)
    with pytest.raises(PushError, match="frame 1 of the payload is not the size that was signed"):
        load(frames, payload.digest, payload.sizes)
    with pytest.raises(PushError, match="2 frames but 1 were signed"):
        load(payload.frames, payload.digest, payload.sizes[:1])


def test_unpicklable_object_names_its_type() -> None:
    import threading

    with pytest.raises(PushError, match="cannot send an object of type dict"):
        dump({"lock": threading.Lock()})
