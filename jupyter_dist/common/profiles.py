"""Profiles: named launcher settings in one YAML file of the Jupyter config folder
(`profiles_path`: ``jupyter_dist_profiles.yaml`` in ``jupyter --config-dir``).

Each top-level key is a profile's name, each of its fields a ``%%distributed`` option
without its dashes, as the cell would say it::

    gpu-pods:
      k8s: true
      namespace: ml-team
      image: registry.example.com/team/train:1.4
      gpus: 4
      node-selector: [nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3]

A switch takes ``true``/``false``, a repeatable option a list (or one value), any other
option a value; a list for a one-value option is joined with commas (``gpus: [4, 2]`` is
``--gpus 4,2``), a mapping becomes JSON text (``ray-runtime-env``). Which options there
are is not written here: the reader of a profile passes the options it knows
(`options_of` an argparse parser), so an option the magic gains is a profile field too.

The file is read with bounds (`MAX_FILE_BYTES` before it is read, YAML composed with
`pod_template.load_bounded`'s limits) and written whole, atomically, mode 0600
(`write_profile`). Every error names the file, the profile and the field.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from jupyter_dist.common.bounded import cut
from jupyter_dist.common.launcher_options import LAUNCHER_NAMES, owner_of
from jupyter_dist.common.pod_template import TemplateLimit, load_bounded
from jupyter_dist.common.small_files import read_bounded
from jupyter_dist.errors import SpecError

#: the file's name in the Jupyter config folder
PROFILES_FILE = "jupyter_dist_profiles.yaml"
#: the largest profiles file read (a hundred profiles take a few KiB)
MAX_FILE_BYTES = 256 * 1024
#: the most profiles one file holds
MAX_PROFILES = 256
#: the most fields one profile has, and values in one list
MAX_FIELDS = 128
#: the longest text one field's value has
MAX_VALUE_CHARS = 4096
#: a profile's name: as a session's
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: options that belong to one cell, never to a profile
CELL_ONLY = ("profile", "push", "ranks")
#: the switches that choose a launcher, and the launcher each chooses
LAUNCHER_SWITCHES: dict[str, str] = {"ray": "ray", "k8s": "k8s", "slurm": "slurm"}

#: how an option takes its value: a switch (``--k8s``), a repeatable option
#: (``--toleration A --toleration B``), or one value
OptionKind = Literal["switch", "many", "value"]
Value = str | int | float | bool | list[Any] | dict[str, Any]


def profiles_path() -> Path:
    """Where the profiles are: ``jupyter_dist_profiles.yaml`` in the Jupyter config folder
    (``JUPYTER_CONFIG_DIR``, else ``~/.jupyter``)."""
    from jupyter_core.paths import jupyter_config_dir

    return Path(jupyter_config_dir()) / PROFILES_FILE


def options_of(parser: argparse.ArgumentParser) -> dict[str, OptionKind]:
    """The long options of ``parser`` a profile may set, by name without dashes, each with
    how it takes its value (`CELL_ONLY` and ``--help`` left out)."""
    kinds: dict[str, OptionKind] = {}
    for action in parser._actions:
        for flag in action.option_strings:
            name = flag[2:]
            if not flag.startswith("--") or name in CELL_ONLY or name == "help":
                continue
            if action.nargs == 0:
                kinds[name] = "switch"
            elif isinstance(action, argparse._AppendAction):
                kinds[name] = "many"
            else:
                kinds[name] = "value"
    return kinds


@dataclass(frozen=True)
class Profile:
    """One profile as the file has it: its fields by option name (dashes, no leading
    ``--``), in the file's order."""

    name: str
    path: Path
    settings: dict[str, Value]

    def where(self, field: str | None = None) -> str:
        """``FILE: profile 'gpu'`` (and ``, field 'nodes'``): what an error starts with."""
        said = f"{self.path}: profile {self.name!r}"
        return f"{said}, field {field!r}" if field is not None else said

    @property
    def launcher(self) -> str:
        """``local``, ``ssh``, ``slurm``, ``ray`` or ``k8s``: the one its fields choose (a
        launcher's own option chooses it, as in a cell)."""
        return launcher_of(self.settings)

    def check_fields(self, known: Mapping[str, OptionKind]) -> None:
        """Each field is one of ``known``; an unknown one is named with the options it is
        close to (else all of them)."""
        for field in self.settings:
            if field in known:
                continue
            if field in CELL_ONLY:
                raise SpecError(
                    f"{self.where(field)}: --{field} belongs to one cell, not to a profile; "
                    "give it in the cell"
                )
            close = difflib.get_close_matches(field, list(known), n=3, cutoff=0.6)
            hint = (
                f"did you mean {' or '.join(close)}?"
                if close
                else f"expected one of {', '.join(sorted(known))}"
            )
            raise SpecError(
                f"{self.where(field)}: no %%distributed option --{field}; {hint} (each "
                "field is an option without its dashes)"
            )

    def argv(self, field: str, kind: OptionKind) -> list[str]:
        """The cell's words for one field: ``["--gpus", "4,2"]``, ``["--k8s"]``, or none
        (a switch set ``false``)."""
        value = self.settings[field]
        flag = f"--{field}"
        if kind == "switch":
            if not isinstance(value, bool):
                raise SpecError(
                    f"{self.where(field)}: {cut(str(value))!r}; expected true or false "
                    f"(--{field} is a switch)"
                )
            return [flag] if value else []
        if isinstance(value, bool):
            raise SpecError(
                f"{self.where(field)}: {str(value).lower()}; expected a value for {flag}, "
                "not true or false"
            )
        if kind == "many":
            items = value if isinstance(value, list) else [value]
            return [word for item in items for word in (flag, self._text(field, item))]
        if isinstance(value, list):
            return [flag, ",".join(self._text(field, item) for item in value)]
        return [flag, self._text(field, value)]

    def _text(self, field: str, value: Any) -> str:
        if isinstance(value, dict):
            return json.dumps(value)
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise SpecError(
                f"{self.where(field)}: {cut(json.dumps(value))}; expected text or a number"
            )
        return str(value)


def launcher_of(settings: Mapping[str, Any]) -> str:
    """The launcher ``settings`` choose: a launcher's switch, its own option, else
    ``hosts``/``hostfile`` for SSH, else ``local``."""
    for field, launcher in LAUNCHER_SWITCHES.items():
        if settings.get(field) is True:
            return launcher
    for field in settings:
        owner = owner_of(f"--{field}")
        if owner is not None:
            return owner
    if settings.get("hosts") or settings.get("hostfile"):
        return "ssh"
    return "local"


def launcher_words(launcher: str) -> str:
    """``Kubernetes``, ``Ray``...; ``local`` for this machine."""
    return LAUNCHER_NAMES.get(launcher, launcher)


def check_name(name: str, where: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise SpecError(
            f"{where}: profile {cut(str(name))!r}: expected a name of 1-64 letters, digits, "
            "'_', '.' or '-', starting with a letter or digit"
        )
    return name


def _read_text(path: Path) -> str | None:
    """The file's text, None when there is none; refused unread past `MAX_FILE_BYTES`,
    or when it is not a regular file (a FIFO would block the reader)."""
    data = read_bounded(path, MAX_FILE_BYTES, str(path), "profiles, YAML")
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(f"{path}: not UTF-8 text (byte {err.start}); expected YAML") from None


def parse_profiles(text: str, path: Path) -> dict[str, Profile]:
    """The profiles of a file's ``text``, each field's name and value shape checked (what
    each option makes of its value is the reader's to check)."""
    try:
        data = load_bounded(text)
    except TemplateLimit as err:
        raise SpecError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: not YAML ({err})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(
            f"{path}: a {type(data).__name__} at the top; expected profiles by name, each "
            "a mapping of options (gpu-pods: {k8s: true, gpus: 4})"
        )
    if len(data) > MAX_PROFILES:
        raise SpecError(f"{path}: {len(data)} profiles; expected at most {MAX_PROFILES}")
    found: dict[str, Profile] = {}
    for name, given in data.items():
        check_name(name, str(path))
        where = f"{path}: profile {name!r}"
        if not isinstance(given, dict | None):
            raise SpecError(
                f"{where}: {cut(json.dumps(given))}; expected a mapping of options "
                "(nodes: 2, gpus: 4)"
            )
        fields: dict[str, Any] = given or {}
        if len(fields) > MAX_FIELDS:
            raise SpecError(f"{where}: {len(fields)} fields; expected at most {MAX_FIELDS}")
        settings: dict[str, Value] = {}
        for key, value in fields.items():
            field = key.removeprefix("--").replace("_", "-")
            if field in settings:
                raise SpecError(f"{where}, field {key!r}: given twice ({field})")
            _check_value(value, f"{where}, field {field!r}")
            settings[field] = value
        found[name] = Profile(name, path, settings)
    return found


def _check_value(value: Any, where: str) -> None:
    if value is None:
        raise SpecError(f"{where}: null; expected a value (leave the field out for the default)")
    if isinstance(value, list) and len(value) > MAX_FIELDS:
        raise SpecError(f"{where}: {len(value)} values; expected at most {MAX_FIELDS}")
    if len(json.dumps(value)) > MAX_VALUE_CHARS:
        raise SpecError(f"{where}: longer than {MAX_VALUE_CHARS} characters")


def read_profiles(path: Path | None = None) -> dict[str, Profile]:
    """Every profile of the file (`profiles_path` unless ``path``); none when there is no
    file."""
    path = profiles_path() if path is None else path
    text = _read_text(path)
    return {} if text is None else parse_profiles(text, path)


def find_profile(name: str, path: Path | None = None) -> Profile:
    """Profile ``name``; SpecError naming the file and the profiles it has when it has no
    such profile, or there is no file."""
    path = profiles_path() if path is None else path
    check_name(name, "--profile")
    profiles = read_profiles(path)
    if name in profiles:
        return profiles[name]
    if not profiles:
        raise SpecError(
            f"--profile {name}: no profiles in {path} (no such file or none in it); "
            "write them there, `%dist profiles` shows how"
        )
    close = difflib.get_close_matches(name, list(profiles), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise SpecError(
        f"--profile {name}: {path} has no profile {name!r}; {hint}it has "
        f"{', '.join(sorted(profiles))}"
    )


def write_profile(name: str, settings: Mapping[str, Value], path: Path | None = None) -> Path:
    """Put profile ``name`` into the file (replacing one of that name, the others kept in
    their order), written whole to a new file beside it, mode 0600, then renamed over it:
    a reader sees the old file or the new one. A comment in the file is not kept."""
    path = profiles_path() if path is None else path
    check_name(name, str(path))
    for field, value in settings.items():
        _check_value(value, f"{path}: profile {name!r}, field {field!r}")
    text = _read_text(path)
    data: dict[str, Any] = {}
    if text is not None:
        data = {p.name: p.settings for p in parse_profiles(text, path).values()}
    data[name] = dict(settings)
    if len(data) > MAX_PROFILES:
        raise SpecError(f"{path}: {len(data)} profiles; expected at most {MAX_PROFILES}")
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
    if len(body.encode()) > MAX_FILE_BYTES:
        raise SpecError(f"{path}: would be larger than {MAX_FILE_BYTES} bytes")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:  # mkstemp: mode 0600
            stream.write(body)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def described(settings: Mapping[str, Value]) -> str:
    """``k8s, namespace=ml, gpus=4``: a profile's fields in a line."""
    words = []
    for field, value in settings.items():
        if value is True:
            words.append(field)
        elif isinstance(value, list):
            words.append(f"{field}={','.join(map(str, value))}")
        elif isinstance(value, dict):
            words.append(f"{field}={json.dumps(value)}")
        else:
            words.append(f"{field}={value}")
    return ", ".join(words)


def example(path: Path) -> str:
    """What `%dist profiles` says when there are none: where the file goes and a file."""
    return (
        f"no profiles: {path} does not exist. Write one there, a profile a top-level key, "
        "its fields %%distributed options without dashes:\n\n"
        "gpu-pods:\n"
        "  k8s: true\n"
        "  namespace: ml-team\n"
        "  image: registry.example.com/team/train:1.4\n"
        "  gpus: 4\n"
        "ray-cluster:\n"
        "  ray-address: head.example.com:6379\n"
        "  gpus: 8\n\n"
        "then: %%distributed --profile gpu-pods --nodes 4 (flags in the cell override the "
        "profile)"
    )


__all__ = [
    "CELL_ONLY",
    "MAX_FILE_BYTES",
    "PROFILES_FILE",
    "OptionKind",
    "Profile",
    "described",
    "example",
    "find_profile",
    "launcher_of",
    "launcher_words",
    "options_of",
    "parse_profiles",
    "profiles_path",
    "read_profiles",
    "write_profile",
]
