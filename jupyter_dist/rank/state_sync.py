"""``%dist sync NAME[,NAME...] --from RANK``: variables copied from one rank to others,
rank to rank, never through the notebook.

The source pickles the named values together, as a push does (`common.pickling`:
cloudpickle at protocol 5, tensors and arrays as out-of-band buffers, so a model and the
optimizer holding its parameters stay tied in the copy), and sends the pickle stream and
each buffer over the session's process group, point to point, as byte tensors viewing
the buffers (no copy on the way out). A receiver rebuilds the values; a module or an
optimizer it already has under that name takes the copy's ``state_dict`` (its identity
kept, so what refers to it, an optimizer or a DDP wrapper, goes on), anything else is
bound to the name.

Sharded state (FSDP2, DTensor) lives in pieces, one on each rank: a piece that existed
only on a lost rank is gone, and no survivor has it to send. `sync` refuses such values
and says so, with the fix: load the last distributed checkpoint (``torch.distributed.
checkpoint``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from jupyter_dist.common import pickling
from jupyter_dist.rank.bootstrap import user_namespace

#: class names whose state is sharded across ranks
_SHARDED = ("DTensor", "FSDPModule", "FullyShardedDataParallel")


def _sharded(value: Any) -> bool:
    names = {k.__name__ for k in type(value).__mro__}
    if names & set(_SHARDED):
        return True
    params = getattr(value, "parameters", None)
    if callable(params):
        try:
            return any(type(p).__name__ == "DTensor" for p in params())
        except Exception:
            return False
    return False


def _send_bytes(data: bytes | memoryview, dst: int) -> None:
    import torch
    import torch.distributed as dist

    view = memoryview(data).cast("B")
    if len(view):
        dist.send(torch.frombuffer(view, dtype=torch.uint8), dst)


def _recv_bytes(size: int, src: int) -> bytearray:
    import torch
    import torch.distributed as dist

    buffer = bytearray(size)
    if size:
        dist.recv(torch.frombuffer(buffer, dtype=torch.uint8), src)
    return buffer


def _send_header(header: dict[str, Any], dst: int) -> None:
    import torch
    import torch.distributed as dist

    data = json.dumps(header).encode()
    dist.send(torch.tensor([len(data)], dtype=torch.int64), dst)
    _send_bytes(data, dst)


def _recv_header(src: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    size = torch.zeros(1, dtype=torch.int64)
    dist.recv(size, src)
    header: dict[str, Any] = json.loads(bytes(_recv_bytes(int(size.item()), src)))
    return header


def _adopt(name: str, value: Any, ns: dict[str, Any]) -> str:
    """Bind ``value`` to ``name``, or load its state into the module or optimizer there."""
    old = ns.get(name)
    if old is not None and type(old) is type(value) and hasattr(old, "load_state_dict"):
        old.load_state_dict(value.state_dict())
        return f"{name} (state_dict loaded)"
    ns[name] = value
    return name


def sync(names: Sequence[str], src: int, dsts: Sequence[int]) -> None:
    """Copy ``names`` from rank ``src`` to ranks ``dsts`` (this rank is one of them)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError(
            "%dist sync copies over the session's process group, and this rank has none"
        )
    me = dist.get_rank()
    ns = user_namespace()
    if me == src:
        missing = [n for n in names if n not in ns]
        sharded = [n for n in names if n in ns and _sharded(ns[n])]
        header: dict[str, Any] = {"missing": missing, "sharded": sharded}
        payload = None
        if not missing and not sharded:
            payload = pickling.dump({n: ns[n] for n in names})
            header.update(payload.signed_fields())
        for dst in dsts:
            _send_header(header, dst)
            if payload is not None:
                for frame in payload.frames:
                    _send_bytes(frame, dst)
        _raise_refusal(header, src)
        print(f"sent {', '.join(names)} to {len(dsts)} rank(s)", flush=True)
        return
    header = _recv_header(src)
    _raise_refusal(header, src)
    frames = [memoryview(_recv_bytes(size, src)) for size in header["sizes"]]
    values = pickling.load(frames, header["digest"], header["sizes"])
    done = [_adopt(name, value, ns) for name, value in values.items()]
    print(f"from rank {src}: {', '.join(done)}", flush=True)


def _raise_refusal(header: dict[str, Any], src: int) -> None:
    if header.get("missing"):
        raise NameError(f"%dist sync: {header['missing'][0]!r} is not defined on rank {src}")
    if header.get("sharded"):
        raise ValueError(
            f"%dist sync: {', '.join(header['sharded'])} is sharded across ranks (FSDP2, "
            "DTensor): the shards of the replaced ranks were lost with them, and no other "
            "rank holds them. Load the last distributed checkpoint instead "
            "(torch.distributed.checkpoint.load into the rebuilt model on every rank)"
        )
