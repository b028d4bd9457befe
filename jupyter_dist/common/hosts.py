"""Where the nodes come from: ``--hosts`` lists and hostfiles.

A host is written like ssh takes it: ``name``, ``user@name``, ``name:port`` or
``user@name:port``, where ``name`` may be an alias of ``~/.ssh/config`` (resolved by the SSH
launcher exactly as ssh would). A hostfile has one host a line, optionally followed by
``slots=N`` (ranks on that node, as in MPI hostfiles) and ``python=PATH`` (that node's
interpreter, over ``--python``); ``#`` starts a comment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from jupyter_dist.errors import SpecError

_HOST = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<name>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(?::(?P<port>\d+))?$"
)


@dataclass(frozen=True)
class HostSpec:
    """One node to reach over SSH."""

    name: str
    user: str | None = None
    port: int | None = None
    slots: int | None = None
    python: str | None = None  # this node's interpreter (hostfile ``python=PATH``)

    def __str__(self) -> str:
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{user}{self.name}{port}"


def parse_host(text: str, where: str = "--hosts") -> HostSpec:
    m = _HOST.match(text.strip())
    if not m:
        raise SpecError(
            f"{where}: {text!r} is not a host; expected name, user@name, name:port or "
            "user@name:port"
        )
    port = int(m.group("port")) if m.group("port") else None
    if port is not None and not 0 < port < 65536:
        raise SpecError(f"{where}: port {port} of {text!r} is outside 1-65535")
    return HostSpec(m.group("name").strip("[]"), m.group("user"), port)


def parse_hosts(text: str) -> tuple[HostSpec, ...]:
    """``"a,b,alice@c:2222"`` -> three hosts; names must not repeat."""
    hosts = tuple(parse_host(part) for part in text.split(",") if part.strip())
    if not hosts:
        raise SpecError(f"--hosts {text!r}: expected one or more hosts, like gpu1,gpu2")
    _no_repeats(hosts, "--hosts")
    return hosts


def read_hostfile(path: str | Path) -> tuple[HostSpec, ...]:
    """Hosts of a hostfile, with their ``slots=N`` if given."""
    file = Path(path).expanduser()
    try:
        text = file.read_text()
    except OSError as err:
        raise SpecError(f"--hostfile {str(path)!r}: cannot read it: {err.strerror}") from None
    hosts = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        where = f"--hostfile {file.name} line {number}"
        host = parse_host(words[0], where)
        slots, python = None, None
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key == "python" and value:
                python = value
            elif key != "slots" or not value.isdigit() or int(value) < 1:
                raise SpecError(
                    f"{where}: {word!r}: expected slots=N with N at least 1, or python=PATH"
                )
            else:
                slots = int(value)
        hosts.append(HostSpec(host.name, host.user, host.port, slots, python))
    if not hosts:
        raise SpecError(f"--hostfile {str(path)!r} lists no hosts")
    result = tuple(hosts)
    _no_repeats(result, f"--hostfile {file.name}")
    return result


def _no_repeats(hosts: tuple[HostSpec, ...], where: str) -> None:
    seen: set[str] = set()
    for host in hosts:
        key = str(host)
        if key in seen:
            raise SpecError(f"{where}: {key!r} is listed twice; give each node once")
        seen.add(key)
