"""How a session's Ray driver reaches the cluster, and how that is said.

Ray's own ``ray.init`` retries an address where nothing answers for minutes, logging as it
goes. The driver (``ray_driver``) bounds it with Ray's own settings (`CONNECT_BOUNDS`, set
in its environment before it imports Ray, each only where the user did not set it): a
first try of about `CONNECT_S` seconds. ``auto`` is looked up here as Ray looks it up
(`find_auto`), so the session can say which cluster it joined and how it was found: the
cluster the last ``ray start`` on this machine wrote into Ray's address file, naming the
file and any other cluster running here, so that joining "whatever cluster was started
last" is said where the start's progress is.

The owner's side (``ray.RayPlacement``) turns what the driver said into words that name
the address and where it came from (`joined_text`, `failure_text`): ``--ray-address``,
``RAY_ADDRESS`` or ``auto``. A failure to reach the cluster begins with "Ray address", the
name of the new-session form's field it is about.

Ray is imported only inside the driver's functions, as in ``ray_driver`` and its parts.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
import time
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any

from jupyter_dist.common.ray_options import RAY_ADDRESS_ENV, origin_text

#: Ray's settings bounding ``ray.init``'s reach of a cluster's GCS: each of its first two
#: gRPC connections waits 1 s (a warning, not a failure: they go on connecting), the
#: cluster's id 5 s (Ray's default: 30 s), and the whole is tried once instead of 20 times
CONNECT_BOUNDS = {
    "RAY_gcs_rpc_server_connect_timeout_s": "1",
    "RAY_py_gcs_connect_timeout_s": "5",
    "RAY_gcs_server_port_wait_time_s": "1",
}
#: about how long the driver's ``ray.init`` tries an address where nothing answers
CONNECT_S = 8.0
#: seconds the owner waits for the driver to say it connected or failed (it imports Ray
#: first: seconds on a loaded machine); past it the driver is stopped
CONNECTED_WAIT_S = 60.0
#: a line of Ray's own C++ log (``[2024-01-01 10:00:00,123 W 12 12] file.cc:42: ...``)
RAY_LOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [DIWEF] \d+ \d+\] ")
#: the GCS port a head listens on unless ``ray start --port`` says otherwise
DEFAULT_GCS_PORT = 6379


def bound_environment(environ: MutableMapping[str, str]) -> None:
    """Put `CONNECT_BOUNDS` into ``environ`` where it does not set them already."""
    for key, value in CONNECT_BOUNDS.items():
        environ.setdefault(key, value)


def find_auto() -> tuple[str | None, str]:
    """What Ray's ``auto`` finds on this machine, looked up as Ray does (`auto_found`):
    the address and how it was found, or None and "" when no cluster runs here. (Ray's
    own helpers; with a Ray that lacks them ``auto`` is left to ``ray.init``.)"""
    try:
        from ray._private import services

        latest = services.find_bootstrap_address(None)
        running = sorted(services.find_gcs_addresses())  # type: ignore[no-untyped-call]
    except Exception:  # another Ray's insides: let ray.init look
        return "auto", "a Ray cluster on this machine"
    return auto_found(latest, running, address_file())


def auto_found(latest: str | None, running: Sequence[str], file: str) -> tuple[str | None, str]:
    """``ray.init``'s own order: the cluster the last ``ray start`` here wrote into Ray's
    address file ``file`` (``latest``), else one whose raylet runs here (``running``): its
    address and how it was found, naming the file and the other clusters running here;
    None and "" for none."""
    if latest:
        others = [a for a in running if a != latest]
        also = (
            f"; {len(others)} other Ray cluster{'s' if len(others) != 1 else ''} run"
            f"{'s' if len(others) == 1 else ''} here: {', '.join(others[:4])}"
            if others
            else ""
        )
        return str(latest), (
            f"the cluster last started on this machine with `ray start`, as Ray's {file} says{also}"
        )
    if running:
        many = (
            f" (the first of {len(running)}: {', '.join(running[:4])})" if len(running) > 1 else ""
        )
        return str(running[0]), f"a Ray cluster running on this machine{many}"
    return None, ""


def address_file() -> str:
    """The file where ``ray start`` leaves its cluster's address for ``auto``:
    ``ray_current_cluster`` in Ray's temporary folder (under RAY_TMPDIR, else TMPDIR)."""
    for module in ("ray._common.utils", "ray._private.utils"):  # newer Ray, then older
        with contextlib.suppress(Exception):
            found = importlib.import_module(module).get_ray_address_file(None)
            return str(found)
    return "ray_current_cluster"


def connect(address: str, namespace: str) -> dict[str, Any]:
    """``ray.init`` to ``address`` (``auto``: what `find_auto` finds), in ``namespace``.

    Returns the fields of the driver's ``connected`` event (``address`` joined, ``found``:
    how ``auto`` found it), or of its ``failed`` event: ``unreachable`` (nothing answered
    at ``address`` within ``seconds``), ``not_found`` (``auto`` found no cluster), or an
    ``error`` of another kind; ``failed`` True for those.
    """
    import ray

    from jupyter_dist.control.launchers.ray_cluster import node_ip
    from jupyter_dist.control.launchers.ray_driver_nodes import explain

    found = ""
    if address == "auto":
        located, found = find_auto()
        if located is None:
            return {"failed": True, "not_found": True, "error": "no Ray cluster runs here"}
        address = located
    began = time.monotonic()
    try:
        ray.init(
            address=address,
            namespace=namespace,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    except (ConnectionError, TimeoutError) as err:
        return {
            "failed": True,
            "unreachable": True,
            "address": address,
            "found": found,
            "seconds": round(time.monotonic() - began, 1),
            "error": explain(err),
        }
    except Exception as err:
        return {
            "failed": True,
            "error": f"cannot connect to the Ray cluster at {address}: {explain(err)}",
        }
    gcs = ""
    with contextlib.suppress(Exception):
        gcs = str(ray.get_runtime_context().gcs_address)
    return {
        "ip": node_ip(),
        "ray_version": ray.__version__,
        "address": gcs or address,
        "found": found,
    }


# -- said on the owner's side --------------------------------------------------------------
def origin_words(origin: str, found: str = "") -> str:
    """Where the address came from, with how ``auto`` found it (``auto`` given by
    --ray-address, left to be, or the value of RAY_ADDRESS)."""
    if origin == "auto" or found:
        how = f": {found}" if found else ""
        asked = "" if origin == "auto" else f" ({origin_text(origin)})"
        return (
            f"found by `auto`{asked}{how}; --ray-address or {RAY_ADDRESS_ENV} name another cluster"
        )
    return origin_text(origin)


def connecting_text(address: str, origin: str) -> str:
    """The progress line while the driver connects."""
    if address == "auto":
        return "Ray cluster: `auto` looks for one on this machine"
    return f"Ray cluster {address} ({origin_text(origin)}): connecting"


def joined_text(event: Mapping[str, Any], address: str, origin: str) -> str:
    """``joined the Ray cluster at 10.0.0.1:6379 (found by `auto`: ...)``."""
    joined = str(event.get("address") or address)
    where = origin_words(origin, str(event.get("found") or ""))
    return f"joined the Ray cluster at {joined} ({where})"


def failure_text(event: Mapping[str, Any], address: str, origin: str) -> str | None:
    """The words for a driver that could not reach the cluster (None: another failure)."""
    if event.get("not_found"):
        return (
            "Ray address `auto`: no Ray cluster runs on this machine to join; name the "
            f"cluster's head with --ray-address HOST:PORT or {RAY_ADDRESS_ENV} "
            f"(HOST:{DEFAULT_GCS_PORT} unless its `ray start --head` was given another --port)"
        )
    if not event.get("unreachable"):
        return None
    tried = str(event.get("address") or address)
    seconds = float(event.get("seconds") or CONNECT_S)
    where = origin_words(origin, str(event.get("found") or ""))
    shown = tried if address == "auto" else address
    how = str(event.get("how") or f" within {seconds:.0f} s")  # `ray_probe.probe`'s words
    return (
        f"Ray address {shown} ({where}): no Ray cluster answered there{how}. "
        "Expected the GCS address of a running cluster's head, HOST:PORT "
        f"(`ray start --head` prints it; port {DEFAULT_GCS_PORT} unless it was given "
        "another --port), reachable from this machine"
    )


def without_ray_log(lines: Iterable[str]) -> list[str]:
    """``lines`` less Ray's own log lines (its retries, its warnings): what is left of a
    driver's stderr is its own (a traceback, an import error)."""
    return [line for line in lines if line.strip() and not RAY_LOG_LINE.match(line)]


__all__ = [
    "CONNECTED_WAIT_S",
    "CONNECT_BOUNDS",
    "CONNECT_S",
    "address_file",
    "auto_found",
    "bound_environment",
    "connect",
    "connecting_text",
    "failure_text",
    "find_auto",
    "joined_text",
    "origin_words",
    "without_ray_log",
]
