"""Serialising Python objects between the notebook and the ranks.

Objects are pickled with cloudpickle (so functions and classes defined in a notebook
travel) at protocol 5, with large buffers out of band: numpy arrays and CPU tensors go
as separate zero-copy frames, which ride as binary buffers on Jupyter comm messages.

Buffers of a Jupyter message are not covered by its HMAC signature, so the signed message
content carries the SHA-256 of the pickle stream and the size of every frame, and `load`
refuses a payload that does not match before unpickling anything. Only the pickle stream
can run code when loaded; the out-of-band frames are raw bytes that the objects it rebuilds
(arrays, tensors) take as their data, so hashing them (56 ms per 100 MB on each side)
would buy no safety. The channels themselves are authenticated too: Unix sockets in a
folder only the user can open, forwarded over SSH for remote nodes.
"""

from __future__ import annotations

import hashlib
import io
import mmap
import pickle
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle

from jupyter_dist.errors import PushError

Frame = bytes | memoryview

#: the comm target through which the notebook pushes and pulls objects (both sides use it)


@dataclass(frozen=True)
class Payload:
    """A pickled object: the pickle stream first, then its out-of-band buffers."""

    frames: list[Frame]
    digest: str  # SHA-256 of frames[0], the pickle stream
    sizes: list[int]  # bytes in each frame

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)

    def signed_fields(self) -> dict[str, Any]:
        """What goes into the HMAC-signed message content beside the buffers."""
        return {"digest": self.digest, "sizes": self.sizes}


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
    return Payload(frames, _digest(frames[0]), [memoryview(f).nbytes for f in frames])


def load(frames: Sequence[Frame], digest: str, sizes: Sequence[int]) -> Any:
    """Check the payload against its signed digest and sizes, then unpickle."""
    if len(frames) != len(sizes) or not frames:
        raise PushError(f"payload has {len(frames)} frames but {len(sizes)} were signed")
    for i, (frame, size) in enumerate(zip(frames, sizes, strict=True)):
        if memoryview(frame).nbytes != size:
            raise PushError(f"frame {i} of the payload is not the size that was signed")
    if _digest(frames[0]) != digest:
        raise PushError("the payload's pickle stream does not match its signed digest")
    # received frames are read-only; arrays users get back must be writable like the
    # originals, so out-of-band buffers are copied once into memory they own (unless
    # they are that already: read from a shared-memory push file)
    owned = [f if isinstance(f, (bytearray, mmap.mmap)) else bytearray(f) for f in frames[1:]]
    return cloudpickle.loads(frames[0], buffers=owned)
