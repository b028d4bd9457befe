"""Where the nodes come from: ``--hosts`` lists and hostfiles.

A host is written like ssh takes it: ``name``, ``user@name``, ``name:port`` or
``user@name:port``, where ``name`` may be an alias of ``~/.ssh/config`` (resolved by the SSH
launcher exactly as ssh would). A hostfile has one host a line, optionally followed by
``slots=N`` (ranks on that node, as in MPI hostfiles) and ``python=PATH`` (that node's
interpreter, over ``--python``); ``#`` starts a comment.

Every value that ends up on a command line (``ssh``, ``srun``, the agent's) is checked
here, whichever way it came in (``--hosts``, a hostfile, a REST body): host and user names
are names, ports are ports, and nothing may start with ``-``, where a program would read it
as one of its options. Files are read only if they are regular files, and only up to
`MAX_FILE_BYTES`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from jupyter_dist.common.bounded import shown as shown_value
from jupyter_dist.common.small_files import read_bounded
from jupyter_dist.errors import SpecError

#: more nodes than one session may have (each is an SSH connection and an agent)
MAX_NODES = 1024
#: hostfiles and ssh configs are read up to this size
MAX_FILE_BYTES = 1 << 20
#: the longest interpreter path taken (Linux's PATH_MAX)
MAX_PATH_CHARS = 4096
#: the most ranks a host's ``slots`` may give it (a session's whole world at most)
MAX_SLOTS = 65536

_NAME = r"[A-Za-z0-9._][A-Za-z0-9._-]{0,252}"  # a DNS name, an IPv4 address, an ssh alias
_IPV6 = r"[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*"
_USER = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,255}"
_HOST = re.compile(r"^(?:(?P<user>[^@]*)@)?(?P<name>[^@:\[\]]*|\[[^\]]*\])(?::(?P<port>[^:]*))?$")
_NAME_RE = re.compile(rf"{_NAME}|{_IPV6}")
_USER_RE = re.compile(_USER)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_COUNT_DIGITS = 9  # more would be more than any machine has, and int() gets slow


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


def no_option(where: str, what: str, value: str) -> None:
    """Refuse ``value`` if a program would take it for one of its options."""
    if value.startswith("-"):
        raise SpecError(
            f"{where}: {what} {value!r} starts with '-', which a command would read as one "
            "of its options"
        )


def check_python(value: object, where: str = "--python") -> str:
    """An interpreter path or command as the nodes will run it."""
    if not isinstance(value, str) or not value.strip():
        raise SpecError(f"{where}: {value!r} is not a Python interpreter path or command")
    if len(value) > MAX_PATH_CHARS or _CONTROL.search(value):
        raise SpecError(
            f"{where}: {value[:80]!r}: expected a path of at most {MAX_PATH_CHARS} characters "
            "without control characters"
        )
    no_option(where, "python", value)
    return value


def whole_number(text: str) -> int | None:
    """``"12"`` -> 12; None for anything but ASCII digits (a sign, ``²``, too many digits)."""
    if not re.fullmatch(rf"[0-9]{{1,{_COUNT_DIGITS}}}", text):
        return None
    return int(text)


def check_host(
    fields: Mapping[str, object], where: str = "hosts", text: str | None = None
) -> HostSpec:
    """A `HostSpec` from its fields (``name``, ``user``, ``port``, ``slots``, ``python``),
    each checked as ``--hosts`` and hostfiles check it; ``text`` is how the user wrote the
    host (None: it came as separate fields, as in a REST body)."""
    name = fields.get("name")
    if not isinstance(name, str):
        raise SpecError(f"{where}: {dict(fields)!r} is not a host; expected {{'name': ...}}")
    shown = name if text is None else text
    bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    no_option(where, "host name", bare)
    if not _NAME_RE.fullmatch(bare):
        expected = (
            "name, user@name, name:port or user@name:port"
            if text is not None
            else "a host name, with its user and port as fields of their own"
        )
        raise SpecError(
            f"{where}: {shown!r} is not a host; expected {expected} (names: letters, "
            "digits, '.', '_', '-')"
        )
    raw_user = fields.get("user")
    user = raw_user if isinstance(raw_user, str) else None
    if raw_user is not None:
        if user is None:
            raise SpecError(f"{where}: user {raw_user!r} of {shown!r} is not a string")
        no_option(where, "user", user)
        if not _USER_RE.fullmatch(user):
            raise SpecError(
                f"{where}: user {user!r} of {shown!r} is not a user name (letters, digits, "
                "'.', '_', '-')"
            )
    raw_port = fields.get("port")
    port = raw_port if isinstance(raw_port, int) and not isinstance(raw_port, bool) else None
    if raw_port is not None and (port is None or not 0 < port < 65536):
        raise SpecError(f"{where}: port {raw_port!r} of {shown!r} is outside 1-65535")
    raw_slots = fields.get("slots")
    slots = raw_slots if isinstance(raw_slots, int) and not isinstance(raw_slots, bool) else None
    if raw_slots is not None and (slots is None or not 1 <= slots <= MAX_SLOTS):
        raise SpecError(
            f"{where}: slots {shown_value(raw_slots)} of {shown!r}: expected a whole number "
            f"of at least 1 and at most {MAX_SLOTS}"
        )
    raw_python = fields.get("python")
    python = None if raw_python is None else check_python(raw_python, f"{where}: {shown!r}")
    return HostSpec(bare, user, port, slots, python)


def parse_host(text: str, where: str = "--hosts") -> HostSpec:
    """``"alice@gpu2:2222"`` -> its `HostSpec`."""
    stripped = text.strip()
    m = _HOST.match(stripped)
    if not m:
        raise SpecError(
            f"{where}: {text!r} is not a host; expected name, user@name, name:port or "
            "user@name:port"
        )
    fields: dict[str, object] = {"name": m.group("name"), "user": m.group("user")}
    if m.group("port") is not None:
        port = whole_number(m.group("port"))
        if port is None:
            raise SpecError(f"{where}: port {m.group('port')!r} of {text!r} is outside 1-65535")
        fields["port"] = port
    return check_host(fields, where, stripped)


def parse_hosts(text: str, where: str = "--hosts") -> tuple[HostSpec, ...]:
    """``"a,b,alice@c:2222"`` -> three hosts; names must not repeat."""
    parts = [part for part in text.split(",") if part.strip()]
    if not parts:
        raise SpecError(f"{where} {text[:80]!r}: expected one or more hosts, like gpu1,gpu2")
    check_node_count(len(parts), where)
    hosts = tuple(parse_host(part, where) for part in parts)
    _no_repeats(hosts, where)
    return hosts


def check_node_count(count: int, where: str) -> None:
    if count > MAX_NODES:
        raise SpecError(f"{where}: {count} hosts; a session takes at most {MAX_NODES} nodes")


def read_small_file(path: str | Path, where: str) -> str:
    """The text of a regular file of at most `MAX_FILE_BYTES`; anything else (a device, a
    pipe, a folder, a bigger file) is refused without reading it."""
    if "\0" in str(path):
        raise SpecError(f"{where} {shown_value(str(path))}: a file's path holds no NUL character")
    label = f"{where} {str(path)!r}"
    data = read_bounded(path, MAX_FILE_BYTES, label, "a small text file")
    if data is None:
        raise SpecError(f"{label}: cannot read it: No such file or directory")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{where} {str(path)!r}: not UTF-8 text") from None


def check_ssh_config(path: object, where: str = "--ssh-config") -> str:
    """An ssh config file that exists and is small enough to read (asyncssh reads it)."""
    if not isinstance(path, str) or not path.strip() or _CONTROL.search(path):
        raise SpecError(f"{where}: {path!r} is not a file path")
    read_small_file(path, where)
    return path


def read_hostfile(path: str | Path) -> tuple[HostSpec, ...]:
    """Hosts of a hostfile, with their ``slots=N`` if given."""
    file = Path(path).expanduser()
    text = read_small_file(path, "--hostfile")
    hosts = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        where = f"--hostfile {file.name} line {number}"
        host = parse_host(words[0], where)
        fields: dict[str, object] = {"name": host.name, "user": host.user, "port": host.port}
        for word in words[1:]:
            key, _, value = word.partition("=")
            slots = whole_number(value) if key == "slots" else None
            if key == "python" and value:
                fields["python"] = value
            elif slots is None or slots < 1:
                raise SpecError(
                    f"{where}: {word!r}: expected slots=N with N at least 1, or python=PATH"
                )
            else:
                fields["slots"] = slots
        hosts.append(check_host(fields, where, words[0]))
        check_node_count(len(hosts), f"--hostfile {file.name}")
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
