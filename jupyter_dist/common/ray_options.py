"""The ``--ray`` options of a session, checked: the cluster's address, how the bundles are
placed, what each bundle holds and the runtime environment Ray prepares on the nodes.

`resolve_ray_address` picks ``--ray-address``, else ``RAY_ADDRESS``, else ``"auto"``, and
`address_origin` says which it was, for the messages that name the address;
`check_strategy`, `parse_runtime_env` and `parse_resources` (``--ray-resources``: custom
resources and an accelerator type) turn user input into values or a `SpecError` naming
the bad value and what was expected.
"""

from __future__ import annotations

import dataclasses
import json
import math
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
#: ``--ray-resources``: the longest text taken, the most resources, the longest name, the
#: largest amount (memory in bytes: 1 PiB) and the smallest (Ray counts in ten-thousandths)
MAX_RESOURCES_CHARS = 4096
MAX_RESOURCES = 32
MAX_RESOURCE_NAME = 128
MAX_RESOURCE_AMOUNT = float(2**50)
MIN_RESOURCE_AMOUNT = 0.0001
#: Ray's ``accelerator_type="A100"`` asks this much of the resource ``accelerator_type:A100``
ACCELERATOR_AMOUNT = 0.001
ACCELERATOR_KEY = "accelerator_type"
#: a resource's name: what Ray's own and its users' custom resources are spelled with
_RESOURCE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/-]*")
_RESOURCES_EXPECTED = (
    "expected NAME=AMOUNT,... or a JSON object, e.g. 'TPU=4,accelerator_type=A100' or "
    "'{\"my_resource\": 2}'"
)


@dataclass(frozen=True)
class RaySpec:
    """How a session's nodes are placed on a Ray cluster (``--ray`` and its options).

    ``address``: the cluster (None: RAY_ADDRESS where the session's owner runs, else
    ``auto``); ``strategy``: the placement group's (`RAY_STRATEGIES`); ``runtime_env``:
    Ray's runtime environment for the node actors, as JSON text ("" for none); ``cpus``:
    CPUs each node's bundle holds; ``gpus``: GPUs it holds (None: the node's ``--gpus``
    count, 0 for ``--procs``); ``resources``: what else it holds, as given to
    ``--ray-resources`` ("" for nothing; `parse_resources`).
    """

    address: str | None = None
    strategy: str = DEFAULT_RAY_STRATEGY
    runtime_env: str = ""
    cpus: int = 1
    gpus: int | None = None
    timeout: float | None = None
    resources: str = ""

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
        parse_resources(self.resources)

    def resources_dict(self) -> dict[str, float]:
        """What each bundle holds besides CPUs and GPUs, by Ray's resource name."""
        return parse_resources(self.resources)

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


def parse_resources(text: str) -> dict[str, float]:
    """``--ray-resources``: custom resources each bundle holds, as Ray's ``resources={...}``
    takes them, and an accelerator type as Ray's ``accelerator_type=`` does.

    ``TPU=4,my_resource=0.5`` or the JSON object ``{"TPU": 4, "my_resource": 0.5}``;
    ``accelerator_type=A100`` (JSON: ``"accelerator_type": "A100"``) is Ray's
    ``accelerator_type:A100`` resource, 0.001 of it, as Ray asks it for a task or actor;
    that resource may also be given itself (``accelerator_type:A100=1``). An amount is
    more than 0 and at most 2**50; one above 1 is whole, one below it a multiple of
    0.0001 (as Ray counts). CPU and GPU are ``--ray-cpus`` and ``--ray-gpus``."""
    if not isinstance(text, str):
        raise SpecError(f"--ray-resources {shown(text)}: {_RESOURCES_EXPECTED}")
    stripped = text.strip()
    if not stripped:
        return {}
    if len(stripped) > MAX_RESOURCES_CHARS:
        raise SpecError(
            f"--ray-resources {shown(text)}: longer than {MAX_RESOURCES_CHARS} characters; "
            f"{_RESOURCES_EXPECTED}"
        )
    pairs: list[tuple[str, object]]
    if stripped.startswith("{"):
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise SpecError(
                f"--ray-resources {shown(text)}: not JSON ({exc.msg} at character "
                f"{exc.pos}); {_RESOURCES_EXPECTED}"
            ) from None
        if not isinstance(value, dict):
            raise SpecError(f"--ray-resources {shown(text)}: {_RESOURCES_EXPECTED}")
        pairs = list(value.items())
    else:
        pairs = []
        for item in stripped.split(","):
            name, sep, amount = item.partition("=")
            if not sep:
                raise SpecError(
                    f"--ray-resources {shown(text)}: {shown(item.strip())} has no '='; "
                    f"{_RESOURCES_EXPECTED}"
                )
            pairs.append((name.strip(), amount.strip()))
    if len(pairs) > MAX_RESOURCES:
        raise SpecError(
            f"--ray-resources {shown(text)}: {len(pairs)} resources; expected at most "
            f"{MAX_RESOURCES}"
        )
    out: dict[str, float] = {}
    for given, wanted in pairs:
        key, count = _resource(given, wanted, text)
        if key in out:
            raise SpecError(f"--ray-resources {shown(text)}: {key!r} is given twice")
        out[key] = count
    return out


def _resource(name: object, amount: object, text: str) -> tuple[str, float]:
    """One ``NAME=AMOUNT`` of ``--ray-resources`` as Ray's resource name and amount."""
    where = f"--ray-resources {shown(text)}"
    if not isinstance(name, str) or not _RESOURCE_NAME.fullmatch(name):
        raise SpecError(
            f"{where}: {shown(name)} is not a resource name (letters, digits and _ . : / -, "
            f"not starting with a punctuation mark)"
        )
    if len(name) > MAX_RESOURCE_NAME:
        raise SpecError(f"{where}: {shown(name)} is longer than {MAX_RESOURCE_NAME} characters")
    if name.upper() in ("CPU", "GPU"):
        flag = "--ray-cpus" if name.upper() == "CPU" else "--ray-gpus"
        raise SpecError(f"{where}: {name!r} is set by {flag} (each bundle's {name.upper()}s)")
    if name == ACCELERATOR_KEY:
        kind = amount.strip() if isinstance(amount, str) else ""
        if not kind or not _RESOURCE_NAME.fullmatch(kind) or len(kind) > MAX_RESOURCE_NAME:
            raise SpecError(
                f"{where}: accelerator_type={shown(amount)}: expected an accelerator type as "
                "Ray names it, e.g. A100, H100, TPU-V4"
            )
        return f"{ACCELERATOR_KEY}:{kind}", ACCELERATOR_AMOUNT
    if isinstance(amount, str):
        try:
            number = float(amount) if len(amount) <= 40 else math.nan
        except ValueError:
            number = math.nan
    elif isinstance(amount, bool) or not isinstance(amount, (int, float)):
        number = math.nan
    else:
        number = float(amount)
    expected = f"expected an amount above 0 and at most 2**50 ({MAX_RESOURCE_AMOUNT:.0f})"
    if not math.isfinite(number) or not 0 < number <= MAX_RESOURCE_AMOUNT:
        raise SpecError(f"{where}: {name}={shown(amount)}: {expected}")
    if number > 1 and not number.is_integer():
        raise SpecError(
            f"{where}: {name}={shown(amount)}: an amount above 1 must be whole, as Ray asks"
        )
    steps = number / MIN_RESOURCE_AMOUNT
    if number < 1 and abs(steps - round(steps)) > 1e-6:
        raise SpecError(
            f"{where}: {name}={shown(amount)}: expected a multiple of {MIN_RESOURCE_AMOUNT} "
            "below 1, as Ray counts"
        )
    return name, number
