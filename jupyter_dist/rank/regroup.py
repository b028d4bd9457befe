"""A surviving rank joins the session's new process group, keeping its namespace.

When the session replaces ranks (one died, one was stuck, a node was lost) or is resized,
every rank joins a new default process group, the replaced ones from their bootstrap and
the survivors here: the old group (whose peers are gone) is retired, not destroyed (gloo's
destructor can deadlock on a group with dead peers; `rank.process_group` keeps such groups
alive), the environment takes the new world (``WORLD_SIZE``, ``MASTER_ADDR``/``PORT``,
``JUPYTER_DIST_GENERATION``), and ``init_process_group`` runs as the bootstrap ran it, its
keys under the new generation's prefix in the session's store, so that nothing of the old
group is read.

What the user built on the old group cannot work on the new one: a DDP or FSDP model, a
DTensor or DeviceMesh, a subgroup from ``new_group``. `built_on_old_group` names them (the
notebook says which to rebuild); accelerate's cached state is made consistent as after a
renewal (`rank.framework_state`). When every rank of the new group is a survivor (no rank
was replaced or added empty), a DDP model that every rank holds under the same name is
rebuilt in place on the new group (`rebuild_ddp`): the same wrapper object, so every
reference to it, an optimizer's too, goes on working.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from jupyter_dist.common.wire_names import REBUILD_MARK, REBUILT
from jupyter_dist.settings import BACKEND_VAR, GENERATION_VAR

#: class names of objects tied to the process group they were built with
_GROUP_BOUND = {
    "DistributedDataParallel": "a DDP model",
    "FullyShardedDataParallel": "an FSDP model",
    "DTensor": "a DTensor",
    "DeviceMesh": "a DeviceMesh",
    "ProcessGroup": "a process group",
}
#: names looked at in the namespace, at most (a namespace of many thousand is cut short)
MAX_NAMES = 10_000


def _bound_kind(value: Any) -> str | None:
    """What ``value`` is, when it is tied to a process group."""
    for klass in type(value).__mro__:
        kind = _GROUP_BOUND.get(klass.__name__)
        if kind is not None:
            return kind
        if klass.__name__ == "FSDPModule":  # FSDP2's fully_shard mixes it into a module
            return "an FSDP2 model"
    return None


def built_on_old_group(namespace: Mapping[str, Any]) -> list[str]:
    """``name (what)`` for every user variable tied to the old process group."""
    if "torch" not in sys.modules:
        return []
    found = []
    for count, (name, value) in enumerate(list(namespace.items())):
        if count >= MAX_NAMES:
            break
        if name.startswith("_"):
            continue
        kind = _bound_kind(value)
        if kind is not None:
            found.append(f"{name} ({kind})")
    return found


def _ddp_names(namespace: Mapping[str, Any]) -> list[str]:
    """Names of the namespace's DDP models, sorted."""
    from torch.nn.parallel import DistributedDataParallel

    found = []
    for count, (name, value) in enumerate(list(namespace.items())):
        if count >= MAX_NAMES:
            break
        if not name.startswith("_") and isinstance(value, DistributedDataParallel):
            found.append(name)
    return sorted(found)


def rebuild_ddp(namespace: Mapping[str, Any]) -> list[str]:
    """Wrap each DDP model's module again, on the (new) default group, with the settings
    it had, and make the old wrapper the new one; only models that every rank holds under
    the same name (agreed over the group first, so that every rank builds the same ones in
    the same order: DDP's constructor is collective). Returns the names rebuilt."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    mine = _ddp_names(namespace)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    common = sorted(set(mine).intersection(*(set(names or ()) for names in everyone)))
    done = []
    for name in common:
        old = namespace[name]
        new = DistributedDataParallel(
            old.module,
            device_ids=old.device_ids,
            output_device=old.output_device,
            broadcast_buffers=old.broadcast_buffers,
            bucket_cap_mb=old.bucket_bytes_cap / (1024 * 1024),
            find_unused_parameters=old.find_unused_parameters,
            gradient_as_bucket_view=old.gradient_as_bucket_view,
            static_graph=old.static_graph,
        )
        old.__dict__.update(new.__dict__)  # the old reducer and its hooks go with its dict
        done.append(name)
    return done


def _retire_default_group() -> None:
    """Take the default group out of torch's registry without tearing it down."""
    import torch.distributed as dist

    from jupyter_dist.rank import process_group

    if not dist.is_initialized():
        return
    process_group.retire_default_group()


def join(
    init: bool,
    addr: str,
    port: int,
    world_size: int,
    generation: int,
    timeout_s: float,
    local_sizes: Sequence[int] = (),
    all_survivors: bool = False,
) -> None:
    """A new rank's first cell (the bootstrap, its environment already the new world's),
    or a survivor's `regroup` (with ``init``: a group is made). ``local_sizes``: the ranks
    on each node of the new world (a resize changes them); ``all_survivors``: no rank of
    the new world starts empty (DDP models are rebuilt in place)."""
    from jupyter_dist.rank import bootstrap

    if not bootstrap.booted:
        bootstrap.bootstrap(init, timeout_s)
        print(REBUILD_MARK + "[]", flush=True)
        return
    env: dict[str, str] = {}
    if local_sizes:
        node = int(os.environ.get("GROUP_RANK") or os.environ.get("NODE_RANK") or 0)
        env["GROUP_WORLD_SIZE"] = str(len(local_sizes))
        if node < len(local_sizes):
            env["LOCAL_WORLD_SIZE"] = str(local_sizes[node])
    if not init:
        os.environ.update({**env, "WORLD_SIZE": str(world_size), GENERATION_VAR: str(generation)})
        print(REBUILD_MARK + "[]", flush=True)
        return
    regroup(addr, port, world_size, generation, timeout_s, env, all_survivors)


def regroup(
    addr: str,
    port: int,
    world_size: int,
    generation: int,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    all_survivors: bool = False,
) -> None:
    """Join generation ``generation``'s process group of ``world_size`` ranks, whose store
    is at ``addr:port``; ``env``: other variables of the new world (``LOCAL_WORLD_SIZE``,
    ...). Prints what was built on the old group (`REBUILD_MARK`), DDP models rebuilt in
    place marked (`REBUILT`) when ``all_survivors``."""
    from IPython import get_ipython

    shell = get_ipython()
    namespace = shell.user_ns if shell is not None else {}
    rebuild = built_on_old_group(namespace)
    os.environ.update(dict(env or {}))
    os.environ.update(
        {
            "MASTER_ADDR": addr,
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(world_size),
            "ROLE_WORLD_SIZE": str(world_size),
            GENERATION_VAR: str(generation),
        }
    )
    if "torch" in sys.modules or os.environ.get(BACKEND_VAR):
        import torch.distributed as dist

        from jupyter_dist.rank import framework_state, group_renewal, process_group

        _retire_default_group()
        process_group.new_generation()
        framework_state.reset()
        backend = os.environ.get(BACKEND_VAR, "gloo")
        timeout = timedelta(seconds=timeout_s)
        dist.init_process_group(backend=backend, timeout=timeout)
        group_renewal.keep(backend, timeout)
        if all_survivors and dist.is_initialized():
            rebuilt = set(rebuild_ddp(namespace))
            rebuild = [
                f"{entry[:-1]}{REBUILT}" if entry.split(" (")[0] in rebuilt else entry
                for entry in rebuild
            ]
    print(REBUILD_MARK + json.dumps(rebuild), flush=True)
