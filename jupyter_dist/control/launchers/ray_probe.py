"""Whether anything that could be a Ray cluster's GCS answers at an address, asked by the
owner before it starts a session's Ray driver.

The driver imports Ray (seconds on a loaded machine) before its bounded ``ray.init`` tries
the address (`ray_reach.CONNECT_S`), so a wrong address took 11-24 s to fail. Asked here
first, over one TCP connection with a deadline of `PROBE_S`, an address where nothing
listens fails at once and one that takes the connection and says nothing fails within
`PROBE_S`, each naming the address and where it came from (`ray_reach.failure_text`).

The GCS speaks gRPC, over HTTP/2: a server answers a client's connection preface with its
own settings at once. The probe sends the preface and waits for any answer; what the
answer is, is left to the driver (a cluster with TLS on, ``RAY_USE_TLS``, answers the
preface with a TLS alert and is then reached by the driver as usual). Only silence, a
refusal or an unreachable host fail here.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import socket
import sys
import tempfile
from collections.abc import Mapping

from jupyter_dist.common.ray_options import check_ray_address
from jupyter_dist.control.launchers.ray_reach import auto_found
from jupyter_dist.errors import SpecError

#: seconds the owner gives an address to take a connection and answer it
PROBE_S = 5.0
#: the most bytes of Ray's address file read (it holds one HOST:PORT)
MAX_ADDRESS_FILE_BYTES = 1024
#: HTTP/2's client connection preface, then an empty SETTINGS frame (RFC 9113, 3.4)
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` (as `ray_options.check_ray_address` lets through)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def ray_address_file(env: Mapping[str, str]) -> str:
    """Where ``ray start`` leaves its cluster's address for ``auto``, found as Ray finds it
    (its temporary folder: RAY_TMPDIR, else TMPDIR on Linux, else /tmp) without importing
    Ray."""
    base = env.get("RAY_TMPDIR")
    if base is None and sys.platform.startswith("linux"):
        base = env.get("TMPDIR")
    if base is None:
        linux_or_mac = sys.platform.startswith(("linux", "darwin"))
        base = os.path.join(os.sep, "tmp") if linux_or_mac else tempfile.gettempdir()
    return os.path.join(base, "ray", "ray_current_cluster")


def auto_from_file(env: Mapping[str, str]) -> tuple[str, str] | None:
    """What ``auto`` takes first: the address in Ray's address file and how it was found
    (`ray_reach.auto_found`'s words), or None without a file holding one (the driver then
    looks further, at the clusters running here)."""
    path = ray_address_file(env)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_ADDRESS_FILE_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_ADDRESS_FILE_BYTES:
        return None
    try:
        address = check_ray_address(raw.decode().strip(), path)
    except (UnicodeDecodeError, SpecError):
        return None
    if address == "auto":
        return None
    return address, auto_found(address, [], path)[1]


def own_address() -> str | None:
    """This machine's address on its default route, as Ray finds it (a UDP socket
    connected, which sends nothing), or None without one."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))
        found: str = s.getsockname()[0]
        return found
    return None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def probe(address: str, timeout: float = PROBE_S) -> str | None:
    """Why no Ray cluster can be answering at ``address``, in words that follow "no Ray
    cluster answered there", or None when something answered (the driver goes on).

    Ray takes a loopback address for this machine's own (its head listens there), so
    with one both are asked, and one that answers is enough."""
    host, port = split_address(address)
    hosts = [host]
    own = own_address() if _loopback(host) else None
    if own is not None and own != host:
        hosts.append(own)
    found = await asyncio.gather(*(_probe(h, port, timeout) for h in hosts))
    return None if any(how is None for how in found) else found[0]


async def _probe(host: str, port: int, timeout: float) -> str | None:
    loop = asyncio.get_running_loop()
    began = loop.time()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except asyncio.TimeoutError:
        return f" within {timeout:.0f} s (the connection was not taken)"
    except socket.gaierror as err:
        return f": its host name {host!r} did not resolve ({err.strerror or err})"
    except ConnectionRefusedError:
        return ": the connection was refused (nothing listens on that port)"
    except OSError as err:
        return f": it could not be reached ({err.strerror or err})"
    try:
        writer.write(HTTP2_PREFACE)
        await writer.drain()
        left = max(0.1, timeout - (loop.time() - began))
        await asyncio.wait_for(reader.read(1), left)
        return None
    except asyncio.TimeoutError:  # (an OSError too, since Python 3.11: caught first)
        return f" within {timeout:.0f} s (it took the connection and said nothing on it)"
    except OSError:  # it closed on the preface (a TLS server): the driver tells
        return None
    finally:
        writer.close()
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), 1.0)


__all__ = ["PROBE_S", "probe", "split_address"]
