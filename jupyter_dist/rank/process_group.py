"""``torch.distributed.init_process_group`` inside a rank, as a torchrun script calls it.

A session's ranks already have their process group when the user's code runs; a script
written for torchrun then calls ``init_process_group("gloo")`` (or ``"nccl"``) itself, and
torch refuses a second default group ("trying to initialize the default process group
twice!"). And a notebook re-runs things: a script that ends with
``destroy_process_group()`` and is run again creates the group anew, in the same ranks,
from the same store, where torch's keys of the first group are still set: the new group
reads them and hangs.

`install` wraps ``init_process_group`` (in ``torch.distributed`` and ``distributed_c10d``):

* with the group already there and arguments torchrun's environment implies (no backend
  or the group's, no ``init_method`` or ``env://``, world size and rank unset or the
  group's, no store), the call returns at once: the script gets the session's group;
  other arguments are refused with a message saying what differs;
* with no group (after ``destroy_process_group``, or in a ``--no-init`` session), an
  ``env://`` group is created through the session's store under a key prefix of its own
  (``jupyter_dist/pg-<n>/``), so it never meets an earlier group's keys. Every rank counts
  its own creations; ranks that create their groups together, as collective code does,
  agree on the prefix. A call naming its own store or another ``init_method`` goes to
  torch unchanged;
* ``destroy_process_group()`` of the default group keeps the group object alive (not
  registered, unused): gloo's destructor, run later by whichever rank's garbage collector
  frees the script's DDP model first, could deadlock in its own lock.

``device_id`` gets the answer a fresh launch gives, whether the group is there or not:
torch 2.13 takes only an accelerator device with an index there (``device_id=cpu`` is
refused by ``_new_process_group_helper`` as the group is made), so a script passing it is
refused the same way on its first run, when the session's group would answer it, as on
its second, after its own ``destroy_process_group``, when the group is made anew
(`check_device_id`). A device torch takes is accepted, and the group is the session's.
A group destroyed by a cell is made again before the next one (`rank.group_renewal`).
"""

from __future__ import annotations

import functools
import os
from datetime import timedelta
from typing import Any

from jupyter_dist.rank import group_sockets
from jupyter_dist.settings import GENERATION_VAR

#: how many groups this rank has created through `install`'s wrapper
_generation = 0
_WRAPPED = "_jupyter_dist_wrapped"
#: default groups destroyed by the user's code, kept from being torn down (see install)
_retired: list[Any] = []
#: at most this many are kept (the oldest are let go)
MAX_RETIRED = 64


def _store_port() -> int | None:
    """The session's store's port (its connections are not the group's own)."""
    try:
        return int(os.environ["MASTER_PORT"])
    except (KeyError, ValueError):
        return None


def _backend_name(backend: Any) -> str:
    return str(backend or "").strip().lower()


def _differences(
    backend: Any, init_method: Any, world_size: int, rank: int, store: Any
) -> list[str]:
    """What a call asks that the session's group is not."""
    import torch.distributed as dist

    have = _backend_name(dist.get_backend())
    asked: list[str] = []
    wanted = _backend_name(backend)
    # "cpu:gloo,cuda:nccl" style requests name the group's backend among others
    if wanted and wanted != have and have not in wanted.replace(":", ",").split(","):
        asked.append(f"backend {wanted!r} (the session's group is {have!r})")
    if init_method not in (None, "", "env://"):
        asked.append(f"init_method {init_method!r} (the session's group came from env://)")
    if world_size not in (-1, None) and world_size != dist.get_world_size():
        asked.append(f"world_size {world_size} (the session has {dist.get_world_size()})")
    if rank not in (-1, None) and rank != dist.get_rank():
        asked.append(f"rank {rank} (this is rank {dist.get_rank()})")
    if store is not None:
        asked.append("a store of its own")
    return asked


def check_device_id(device_id: Any) -> None:
    """Refuse a ``device_id`` as torch 2.13's ``init_process_group`` does when it makes a
    group, saying what to pass instead; None and an accelerator device with an index pass."""
    if device_id is None:
        return
    import torch

    accelerator = torch.accelerator.current_accelerator()
    shown = f"init_process_group(device_id={device_id!r})"
    if isinstance(device_id, bool) or not isinstance(device_id, (int, torch.device)):
        raise TypeError(
            f"{shown}: expected a torch.device or an int, not {type(device_id).__name__}"
        )
    if isinstance(device_id, int):
        if accelerator is None:
            raise ValueError(
                f"{shown}: an int names an accelerator device, and this torch has no "
                "accelerator support; leave device_id out on CPU"
            )
        device_id = torch.device(accelerator.type, device_id)
    if device_id.type == "cpu" or device_id.index is None:
        raise ValueError(
            f"{shown}: torch takes only an accelerator device with an index here "
            "(a fresh torchrun launch refuses this call too: 'init_process_group device_id "
            "parameter must be an accelerator with an index'); leave device_id out on CPU, "
            "or pass torch.device('cuda', LOCAL_RANK)"
        )
    if accelerator is None or device_id.type != accelerator.type:
        raise ValueError(
            f"{shown}: this torch's accelerator is {accelerator}, not {device_id.type!r}"
        )
    count = torch.accelerator.device_count()
    if device_id.index >= count:
        raise ValueError(
            f"{shown}: out of range, this rank sees {count} {device_id.type} device(s)"
        )


def _prefix() -> str:
    """The session's group generation's keys in the store: ``jupyter_dist/`` for the
    first group, ``jupyter_dist/g<n>/`` after the n-th regroup (`rank.regroup`), so that
    a new group never reads an old one's keys."""
    generation = os.environ.get(GENERATION_VAR, "0")
    return "jupyter_dist/" if generation in ("", "0") else f"jupyter_dist/g{generation}/"


def new_generation() -> None:
    """The session regroups: this rank counts its groups afresh, as the new ranks do."""
    global _generation
    _generation = 0


def retire_default_group() -> None:
    """Take the default group out of torch's registry, kept alive (see `install`)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not dist.is_initialized():
        return
    _retired.append(c10d._get_default_group())
    del _retired[:-MAX_RETIRED]
    destroy = getattr(c10d.destroy_process_group, "__wrapped__", c10d.destroy_process_group)
    destroy()


def install() -> None:
    """Wrap ``init_process_group`` as the module says; idempotent."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    original = c10d.init_process_group
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def init_process_group(
        backend: Any = None,
        init_method: str | None = None,
        timeout: timedelta | None = None,
        world_size: int = -1,
        rank: int = -1,
        store: Any = None,
        group_name: str = "",
        pg_options: Any = None,
        device_id: Any = None,
        **kwargs: Any,
    ) -> None:
        global _generation
        check_device_id(device_id)  # the same answer with the session's group as without
        if dist.is_initialized():
            differs = _differences(backend, init_method, world_size, rank, store)
            if not differs:
                return None  # the session's group is the one the script asks for
            raise RuntimeError(
                "init_process_group: this rank already has the session's process group "
                f"({dist.get_backend()}, world size {dist.get_world_size()}), and the call "
                f"asks for {'; '.join(differs)}. Call destroy_process_group() first, or "
                "start the session with the backend you need (--backend), or with --no-init "
                "to create the group yourself"
            )
        if store is None and init_method in (None, "", "env://") and "MASTER_ADDR" in os.environ:
            _generation += 1
            world = world_size if world_size not in (-1, None) else int(os.environ["WORLD_SIZE"])
            me = rank if rank not in (-1, None) else int(os.environ["RANK"])
            wait = timeout or timedelta(minutes=10)
            found = c10d.rendezvous(  # type: ignore[attr-defined]
                "env://", rank=me, world_size=world, timeout=wait
            )
            base, me, world = next(found)
            store = c10d.PrefixStore(f"{_prefix()}pg-{_generation}/", base)
            with group_sockets.recording(_store_port()):
                return original(
                    backend,
                    timeout=timeout,
                    world_size=world,
                    rank=me,
                    store=store,
                    group_name=group_name,
                    pg_options=pg_options,
                    device_id=device_id,
                    **kwargs,
                )
        with group_sockets.recording(_store_port()):
            return original(
                backend,
                init_method,
                timeout,
                world_size,
                rank,
                store,
                group_name,
                pg_options,
                device_id,
                **kwargs,
            )

    setattr(init_process_group, _WRAPPED, True)
    torch_modules: list[Any] = [c10d, dist]  # replaced on both, for either import style
    for module in torch_modules:
        module.init_process_group = init_process_group

    destroy = c10d.destroy_process_group

    @functools.wraps(destroy)
    def destroy_process_group(group: Any = None) -> None:
        if group is None and dist.is_initialized():
            # kept alive: a DDP model freed later (by garbage collection, at a moment that
            # differs from rank to rank) would otherwise run gloo's destructor then, and that
            # destructor can deadlock on its own lock; one idle group a re-creation is cheap
            _retired.append(c10d._get_default_group())
            del _retired[:-MAX_RETIRED]
        destroy(group)

    setattr(destroy_process_group, _WRAPPED, True)
    for module in torch_modules:
        module.destroy_process_group = destroy_process_group
