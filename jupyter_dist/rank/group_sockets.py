"""The connections of a rank's process group, and freeing a rank stuck in one of its
collectives.

A stop interrupts every rank at once, but a rank sits where the signal lands: one may
raise ``KeyboardInterrupt`` in its forward pass while another already waits in the
backward pass's all-reduce for it. That one waits in C code, where no interrupt reaches,
for a peer that will never come: gloo gives up only after the group's timeout (30 minutes
by default). Nothing in the rank is wrong but its group.

gloo ends a collective at once, with an error, when a connection of its group closes (the
"Connection closed by peer" of a rank that died). So while the group is made (`recording`,
around ``init_process_group``), the rank notes the connected TCP sockets that appear: the
group's pairs to the other ranks, not its listener and not the session's store. To free
the main thread (`free`, run by another thread of the rank: `rank.stack_dumps`), those
sockets are shut down, not closed (their numbers stay the group's, so no later file can
take them): the waiting collective fails, the main thread returns to Python, the pending
interrupt is raised there, and the rank answers as any interrupted rank does. Its peers'
ends close too, so the group is over for every rank: the session joins them all in a new
one (`rank.regroup`), and every rank keeps its variables. A listener is left alone: gloo
aborts the process when its listener fails.

For an NCCL group the backend's own ``abort`` ends its communicators' collectives.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

_FD_DIR = "/proc/self/fd"
#: the current group's connections: (file descriptor, ``socket:[inode]``)
_held: list[tuple[int, str]] = []
#: how many times `free` shut them (the error the freed collective raised is ours)
_frees = 0


def _sockets() -> dict[int, str]:
    """This process's sockets: file descriptor -> ``socket:[inode]``."""
    found: dict[int, str] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(_FD_DIR):
            with contextlib.suppress(OSError, ValueError):
                link = os.readlink(f"{_FD_DIR}/{name}")
                if link.startswith("socket:"):
                    found[int(name)] = link
    return found


def _ends(fd: int) -> tuple[int, int | None] | None:
    """``(local port, peer port)`` of TCP socket ``fd`` (peer None: a listener), or None
    for anything else."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        if sock.type != socket.SOCK_STREAM or sock.family not in (
            socket.AF_INET,
            socket.AF_INET6,
        ):
            return None
        here = sock.getsockname()[1]
        try:
            return here, sock.getpeername()[1]
        except OSError:  # not connected: a listener
            return here, None
    except OSError:
        return None
    finally:
        sock.detach()  # the descriptor stays open


@contextlib.contextmanager
def recording(store_port: int | None) -> Iterator[None]:
    """Note the group connections made inside the block (the default group's, replacing
    those of the group before)."""
    before = _sockets()
    # connections accepted meanwhile by listeners that were there before (the kernel's
    # own ports: a client connecting as the group is made) are not the group's
    listening = {ends[0] for fd in before if (ends := _ends(fd)) and ends[1] is None}
    try:
        yield
    finally:
        after = _sockets()
        made = [(fd, link) for fd, link in after.items() if before.get(fd) != link]
        held = []
        for fd, link in made:
            ends = _ends(fd)
            if ends is None or ends[1] is None:  # not TCP, or a listener
                continue
            here, peer = ends
            if store_port in (here, peer) or here in listening or peer in listening:
                continue
            held.append((fd, link))
        _held[:] = held


def held() -> int:
    """How many connections of the current group are known."""
    return len(_held)


def free() -> int:
    """Shut down the current group's connections, so that a collective waiting on them
    fails at once; abort an NCCL group's communicators. Returns how many were shut."""
    shut = 0
    for fd, link in _held:
        try:
            if os.readlink(f"{_FD_DIR}/{fd}") != link:
                continue  # closed since, and the number taken by something else
            sock = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            sock.shutdown(socket.SHUT_RDWR)
            shut += 1
        except OSError:
            pass
        finally:
            sock.detach()
    global _frees
    _frees += 1
    _abort_accelerator_group()
    return shut


def freed() -> bool:
    """Whether `free` ran in this process (the next interrupt's context, a collective
    that failed as its connections closed, is then this package's doing)."""
    return _frees > 0


def hide_freed_error(value: BaseException) -> None:
    """An interrupt raised as a freed collective failed says only that: the collective's
    own error ("Connection closed by peer ... a remote worker crashing") is not chained
    to it, as nothing crashed."""
    context = value.__context__
    if freed() and isinstance(context, RuntimeError) and "Connection closed" in str(context):
        value.__suppress_context__ = True


def _abort_accelerator_group() -> None:
    """``abort`` the default group's backend where it is not gloo (NCCL's ends its
    communicators' waiting collectives); nothing when torch is not loaded."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    with contextlib.suppress(Exception):
        if dist.get_backend() == "gloo":
            return
        group = dist.distributed_c10d._get_default_group()
        group.abort()
