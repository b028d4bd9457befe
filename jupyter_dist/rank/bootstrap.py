"""What runs inside each rank kernel before the first cell.

`bootstrap` sets the thread count and CUDA device the way torchrun's workers expect,
creates the default process group from the environment (``env://``), and registers the
comm target through which the notebook pushes and pulls objects. What it initialises
follows the session's ``--framework`` (``JUPYTER_DIST_FRAMEWORK``): ``torch`` the process
group, ``jax`` what ``jax.distributed.initialize()`` needs (`jupyter_dist.rank.jax_cluster`),
``none`` nothing. The rank side imports nothing of widgets or the server.
"""

from __future__ import annotations

import errno
import os
import socket
from datetime import timedelta
from typing import Any

from jupyter_dist.common import pickling, shared_push
from jupyter_dist.common.wire_names import OBJECTS_TARGET
from jupyter_dist.settings import BACKEND_VAR, DEVICE_VAR, FRAMEWORK_VAR, MASTER_PORTS_VAR


def user_namespace() -> dict[str, Any]:
    """The rank kernel's user namespace (its cells' globals)."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("jupyter_dist rank bootstrap must run inside an IPython kernel")
    ns: dict[str, Any] = shell.user_ns
    return ns


def _on_objects_open(comm: Any, _open_msg: dict[str, Any]) -> None:
    def on_msg(msg: dict[str, Any]) -> None:
        data = msg["content"]["data"]
        request_id = data.get("id")
        try:
            if data.get("op") == "push":
                buffers = list(msg.get("buffers") or [])
                if "shared" in data:  # the rest is in a file of this machine's memory
                    buffers[1:] = shared_push.read(str(data["shared"]), data["sizes"][1:])
                values = pickling.load(buffers, data["digest"], data["sizes"])
                user_namespace().update(values)
                comm.send({"op": "ok", "id": request_id, "names": sorted(values)})
            elif data.get("op") == "pull":
                name = data["name"]
                ns = user_namespace()
                if name not in ns:
                    rank = os.environ.get("RANK", "?")
                    raise NameError(f"name {name!r} is not defined on rank {rank}")
                payload = pickling.dump(ns[name])
                comm.send(
                    {"op": "value", "id": request_id, **payload.signed_fields()},
                    buffers=payload.frames,
                )
            else:
                raise ValueError(f"unknown objects op {data.get('op')!r}")
        except Exception as err:
            comm.send(
                {"op": "error", "id": request_id, "ename": type(err).__name__, "evalue": str(err)}
            )

    comm.on_msg(on_msg)


def register_objects_target() -> None:
    import comm

    comm.get_comm_manager().register_target(OBJECTS_TARGET, _on_objects_open)


#: the rendezvous store this rank hosts (rank 0 only); kept alive with the kernel
_store: Any = None
#: how long one try at starting the store may take, and how many tries there are
STORE_START_S = 20.0
STORE_TRIES = 3


def host_store(addr: str, port: int, world_size: int, timeout_s: float) -> None:
    """Rank 0 only: serve the TCPStore every rank of the session meets at.

    torchrun's agent hosts this store and sets TORCHELASTIC_USE_AGENT_STORE=True so that
    workers connect as clients; here rank 0's kernel plays the agent's part. The store is
    listening before any rank connects, so nobody waits in a connect back-off, and a user
    who destroys and re-creates the process group meets the same store again.

    Making the store includes its own client's connection to it, which waits in C++ (no
    interrupt reaches it) for as long as the store's timeout, and whose logging looks up
    the peer's name: a name server that drops that query costs 5 to 10 s before torch
    gives lookups up. So a try may take `STORE_START_S` at most and is repeated on a fresh
    listening socket; the store then gets the session's own timeout.
    """
    global _store
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    failures: list[str] = []
    for _ in range(STORE_TRIES):
        listening = listen_on(addr, port)  # a fresh socket a try: the store takes it over
        try:
            store = TCPStore(
                addr,
                port,
                world_size,
                is_master=True,
                timeout=timedelta(seconds=min(timeout_s, STORE_START_S)),
                wait_for_workers=False,
                master_listen_fd=listening,
            )
        except RuntimeError as err:  # torch's DistError family
            failures.append(f"{type(err).__name__}: {str(err).splitlines()[0]}")
            if "EADDRINUSE" in str(err):
                break  # another process holds the port: trying again will not help
            continue
        store.set_timeout(timedelta(seconds=timeout_s))
        _store = store
        return
    raise RuntimeError(
        f"could not start the rendezvous store at {addr}:{port} ("
        + "; ".join(f"try {n}: {why}" for n, why in enumerate(failures, 1))
        + ")"
    )


class StoreAddressError(RuntimeError):
    """The rendezvous store cannot listen on the address the ranks will connect to."""


def listen_on(addr: str, port: int) -> int:
    """A socket listening on the address the ranks will connect to, and only there.

    TCPStore on its own listens on every interface; a single-node session's store thus
    stays on the loopback address, and a multi-node one on the interface the other nodes
    reach. When that address is not this machine's (or the port is taken) this fails
    rather than let TCPStore open the store on every interface.
    """
    where = f"{addr}:{port} on {socket.gethostname()}"
    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, sockaddr = infos[0]
    except (OSError, IndexError) as err:
        raise StoreAddressError(
            f"the rendezvous store cannot listen on {where}: {addr!r} does not resolve "
            f"here ({err}); MASTER_ADDR must be an address of this machine"
        ) from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(socket.SOMAXCONN)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            fix = (
                f"another process holds port {port}; start the session again, or choose "
                f"the ports with {MASTER_PORTS_VAR}"
            )
        else:
            fix = (
                f"{addr} must be an address of this machine (node 0) that the other nodes "
                "reach: connect to node 0 by such an address (HostName in the ssh config), "
                "not through NAT or a proxy that changes it"
            )
        raise StoreAddressError(
            f"the rendezvous store cannot listen on {where} ({err.strerror or err}); {fix}. "
            "It is never opened on every interface instead"
        ) from None
    return sock.detach()


#: whether this rank ran `bootstrap` (a rank kernel started by a heal has not yet)
booted = False


def bootstrap(init_process_group: bool, timeout_s: float) -> None:
    """Prepare this rank; called once, silently, before the first cell."""
    global booted
    booted = True
    register_objects_target()
    _install_metrics()
    import torch

    threads = int(os.environ.get("OMP_NUM_THREADS") or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    if os.environ.get(DEVICE_VAR) == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    from jupyter_dist.rank import process_group, spawn_env

    process_group.install()  # a script's own init_process_group gets the session's group
    spawn_env.install()  # mp.spawn's children make a group of their own
    if init_process_group:
        import torch.distributed as dist

        from jupyter_dist.rank import group_renewal

        backend = os.environ.get(BACKEND_VAR, "gloo")
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
        group_renewal.keep(backend, timedelta(seconds=timeout_s))  # made again if destroyed
    if os.environ.get(FRAMEWORK_VAR) == "jax":
        from jupyter_dist.rank import jax_cluster

        jax_cluster.prepare(_store, timeout_s)


def _install_metrics() -> None:
    from IPython import get_ipython

    from jupyter_dist.rank import metrics as rank_metrics

    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if kernel is not None:
        rank_metrics.install(kernel, shell)
