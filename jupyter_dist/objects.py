"""Serialising Python objects between the notebook and the ranks.

Objects are pickled with cloudpickle (so functions and classes defined in a notebook
travel) at protocol 5, with large buffers out of band: numpy arrays and CPU tensors go
as separate zero-copy frames, which ride as binary buffers on Jupyter comm messages.

Buffers of a Jupyter message are not covered by its HMAC signature, so every payload
carries the SHA-256 of each frame in the signed message content, and `load` refuses a
frame whose digest does not match before unpickling anything.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle

from jupyter_dist.errors import PushError

Frame = bytes | memoryview


@dataclass(frozen=True)
class Payload:
    """A pickled object: the pickle stream first, then its out-of-band buffers."""

    frames: list[Frame]
    digests: list[str]

    @property
    def nbytes(self) -> int:
        return sum(memoryview(f).nbytes for f in self.frames)


def _digest(frame: Frame) -> str:
    return hashlib.sha256(frame).hexdigest()


def _tensor_from_array(array: Any) -> Any:
    import torch

    return torch.from_numpy(array)


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle, plus plain tensors sent out of band as numpy arrays.

    Tensors travel as CPU tensors: the notebook is a front end that often has no GPU
    (and must not grab one), so a pulled CUDA tensor arrives on the CPU, and a rank moves
    what it is pushed with ``.cuda()`` / ``.to(device)`` like any loaded data.
    """

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if (
            torch is not None
            and type(obj) is torch.Tensor
            and obj.layout == torch.strided
            and not obj.requires_grad
            and "numpy" in sys.modules
        ):
            try:
                array = obj.detach().cpu().contiguous().numpy()
            except (TypeError, RuntimeError):  # dtypes numpy lacks (bfloat16...)
                return super().reducer_override(obj)
            return _tensor_from_array, (array,)
        return super().reducer_override(obj)


def dump(obj: Any) -> Payload:
    """Pickle ``obj``; raise `PushError` naming the object's type if it cannot be."""
    buffers: list[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    try:
        _Pickler(stream, protocol=5, buffer_callback=buffers.append).dump(obj)
    except Exception as err:
        raise PushError(
            f"cannot send an object of type {type(obj).__name__}: {type(err).__name__}: {err}"
        ) from err
    frames: list[Frame] = [stream.getbuffer()]
    frames.extend(b.raw() for b in buffers)
    return Payload(frames, [_digest(f) for f in frames])


def load(frames: Sequence[Frame], digests: Sequence[str]) -> Any:
    """Check every frame against its signed digest, then unpickle."""
    if len(frames) != len(digests) or not frames:
        raise PushError(f"payload has {len(frames)} frames but {len(digests)} digests")
    for i, (frame, digest) in enumerate(zip(frames, digests, strict=True)):
        if _digest(frame) != digest:
            raise PushError(f"frame {i} of the payload does not match its signed digest")
    # received frames are read-only; arrays users get back must be writable like the
    # originals, so out-of-band buffers are copied once into memory they own
    return cloudpickle.loads(frames[0], buffers=[bytearray(f) for f in frames[1:]])
