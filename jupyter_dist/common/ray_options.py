"""The ``--ray`` options of a session, checked: the cluster's address, how the bundles are
placed and the runtime environment Ray prepares on the nodes.

`resolve_ray_address` picks ``--ray-address``, else ``RAY_ADDRESS``, else ``"auto"``, and
`address_origin` says which it was, for the messages that name the address;
`check_strategy` and `parse_runtime_env` turn user input into values or a `SpecError`
naming the bad value and what was expected.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from jupyter_dist.common.bounded import check_seconds_in, check_whole, shown
from jupyter_dist.common.payloads import RaySpecJSON
from jupyter_dist.errors import SpecError

#: placement strategies a session's placement group may use; the first is the default
RAY_STRATEGIES = ("STRICT_SPREAD", "PACK", "SPREAD")
DEFAULT_RAY_STRATEGY = RAY_STRATEGIES[0]
#: Ray's own variable naming the cluster a driver connects to
RAY_ADDRESS_ENV = "RAY_ADDRESS"
#: the longest a session may wait for the cluster to have room (a day)
MAX_WAIT_S = 86400.0
#: the most CPUs or GPUs one bundle (one node of a session) may ask for
MAX_BUNDLE_UNITS = 4096
#: the longest cluster address taken (a DNS name is at most 253 characters)
MAX_ADDRESS_CHARS = 300
#: a cluster's host: a DNS name or an IPv4 address (starting with a letter or a digit),
#: or an IPv6 address in brackets
_ADDRESS_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\]")
_PORT = re.compile(r"[0-9]{1,5}")


@dataclass(frozen=True)
class RaySpec:
    """How a session's nodes are placed on a Ray cluster (``--ray`` and its options).

    ``address``: the cluster (None: RAY_ADDRESS where the session's owner runs, else
    ``auto``); ``strategy``: the placement group's (`RAY_STRATEGIES`); ``runtime_env``:
    Ray's runtime environment for the node actors, as JSON text ("" for none); ``cpus``:
    CPUs each node's bundle holds; ``gpus``: GPUs it holds (None: the node's ``--gpus``
    count, 0 for ``--procs``).
    """

    address: str | None = None
    strategy: str = DEFAULT_RAY_STRATEGY
    runtime_env: str = ""
    cpus: int = 1
    gpus: int | None = None
    timeout: float | None = None

    def __post_init__(self) -> None:
        if self.address is not None:
            check_ray_address(self.address, "--ray-address")
        if self.strategy != check_strategy(self.strategy):
            raise SpecError(
                f"--ray-strategy {shown(self.strategy)}: expected one of "
                f"{', '.join(RAY_STRATEGIES)}"
            )
        if self.runtime_env:
            parse_runtime_env(self.runtime_env)
        if self.timeout is not None:
            check_seconds_in("--ray-timeout", self.timeout, MAX_WAIT_S)
        check_whole("--ray-cpus", self.cpus, 1, MAX_BUNDLE_UNITS)
        if self.gpus is not None:
            check_whole("--ray-gpus", self.gpus, 0, MAX_BUNDLE_UNITS)

    def runtime_env_dict(self) -> dict[str, Any] | None:
        return parse_runtime_env(self.runtime_env) if self.runtime_env else None

    def to_json(self) -> RaySpecJSON:
        return cast(RaySpecJSON, dataclasses.asdict(self))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RaySpec:
        """From `to_json` or a request's ``ray`` object; unknown keys are refused."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(
                f"ray: unknown field {unknown[0]!r}; expected {', '.join(sorted(known))}"
            )
        return cls(**dict(data))


def resolve_ray_address(flag: str | None, env: Mapping[str, str]) -> str:
    """The address the driver connects to: ``--ray-address``, RAY_ADDRESS, or ``"auto"``."""
    if flag is not None:
        return check_ray_address(flag, "--ray-address")
    from_env = env.get(RAY_ADDRESS_ENV, "").strip()
    if from_env:
        return check_ray_address(from_env, RAY_ADDRESS_ENV)
    return "auto"


def address_origin(flag: str | None, env: Mapping[str, str]) -> str:
    """Where `resolve_ray_address` took the address from: ``--ray-address``,
    ``RAY_ADDRESS`` or ``auto`` (none given: Ray looks for a cluster on this machine)."""
    if flag is not None:
        return "auto" if flag.strip() == "auto" else "--ray-address"
    return RAY_ADDRESS_ENV if env.get(RAY_ADDRESS_ENV, "").strip() else "auto"


def origin_text(origin: str) -> str:
    """An address's origin in words: ``given by --ray-address``, ``from RAY_ADDRESS``,
    ``found by `auto```."""
    if origin == RAY_ADDRESS_ENV:
        return f"from the {RAY_ADDRESS_ENV} environment variable"
    if origin == "auto":
        return "found by `auto`"
    return f"given by {origin}"


def check_ray_address(address: str, where: str) -> str:
    """``auto``, or a cluster's GCS address ``HOST:PORT`` (``ray://`` is refused: it
    cannot carry rank traffic). HOST is a DNS name, an IPv4 address or an IPv6 one in
    brackets; nothing that a program would read as one of its options (a leading ``-``),
    no NUL or other control character, no space."""
    expected = "expected HOST:PORT with a port 1-65535 (e.g. head:6379) or 'auto'"
    if not isinstance(address, str):
        raise SpecError(f"{where} {shown(address)}: {expected}")
    value = address.strip()
    if value == "auto":
        return value
    if len(value) > MAX_ADDRESS_CHARS:
        raise SpecError(
            f"{where} {shown(address)}: {expected}, of at most {MAX_ADDRESS_CHARS} characters"
        )
    bad = next((c for c in value if ord(c) < 32 or ord(c) == 127 or c.isspace()), None)
    if bad is not None:
        what = "a NUL character" if bad == "\0" else f"the character {bad!r}"
        raise SpecError(f"{where} {shown(address)}: it holds {what}; {expected}")
    if value.startswith("-"):
        raise SpecError(
            f"{where} {shown(address)}: it starts with '-', which a program would read as "
            f"one of its options; {expected}"
        )
    if value.startswith("ray://"):
        raise SpecError(
            f"{where} {shown(address)}: Ray Client addresses (ray://) are not supported; "
            "expected the cluster's GCS address HOST:PORT (e.g. head:6379) or 'auto'"
        )
    host, sep, port = value.rpartition(":")
    if not sep or not _PORT.fullmatch(port) or not 0 < int(port) < 65536:
        raise SpecError(f"{where} {shown(address)}: {expected}")
    if not _ADDRESS_HOST.fullmatch(host):
        raise SpecError(
            f"{where} {shown(address)}: {host!r} is not a host name or address (letters, "
            f"digits, '.', '_', '-'; an IPv6 address in brackets, [::1]:6379); {expected}"
        )
    return value


def check_strategy(value: str) -> str:
    """A placement strategy, case-insensitive, as Ray spells it."""
    if not isinstance(value, str):
        raise SpecError(
            f"--ray-strategy {shown(value)}: expected one of {', '.join(RAY_STRATEGIES)}"
        )
    upper = value.strip().upper()
    if upper not in RAY_STRATEGIES:
        raise SpecError(
            f"--ray-strategy {shown(value)}: expected one of {', '.join(RAY_STRATEGIES)}"
        )
    return upper


def parse_runtime_env(text: str) -> dict[str, Any]:
    """``--ray-runtime-env JSON``: a JSON object, e.g. ``{"pip": ["jupyter_dist"]}``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(
            f"--ray-runtime-env {shown(text)}: not JSON ({exc.msg} at character {exc.pos}); "
            'expected a JSON object such as \'{"pip": ["jupyter_dist"]}\''
        ) from None
    if not isinstance(value, dict):
        raise SpecError(
            f"--ray-runtime-env {shown(text)}: a JSON {type(value).__name__}; expected a JSON "
            'object such as \'{"pip": ["jupyter_dist"]}\''
        )
    return value
