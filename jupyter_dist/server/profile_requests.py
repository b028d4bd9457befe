"""Profiles under the server: a profile's fields (``%%distributed`` options) as the body
of ``POST /sessions``, and such a body as a profile's fields (the sidebar's "save as
profile").

Which option is which field is derived, not listed: an option a launcher owns
(`launcher_options.OPTIONS`) is a field of that launcher's object, named without the
launcher's prefix (``--ray-cpus`` -> ``ray.cpus``, ``--k8s-queue`` -> ``k8s.queue``,
``--namespace`` -> ``k8s.namespace``; a plural field takes its singular option,
``--toleration`` -> ``k8s.tolerations``); any other option is the request's field of its
name (``--ssh-config`` -> ``ssh_config``); the launcher switches are ``launcher``,
``--no-init`` is ``init: false`` and ``--session`` the ``name``. An option of one cell
that the request has no field for (``--output``, ``--heal``) is listed as not used here;
one of a launcher that maps to no field is refused by name, never dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from jupyter_dist.common.bounded import cut
from jupyter_dist.common.launcher_options import OPTIONS, owner_of
from jupyter_dist.common.profiles import (
    LAUNCHER_SWITCHES,
    Profile,
    Value,
    check_name,
    find_profile,
)
from jupyter_dist.errors import SpecError
from jupyter_dist.server.handlers import (
    FILE_CHECK_S,
    K8S_FIELDS,
    RAY_FIELDS,
    REQUEST_FIELDS,
    shape_from_json,
)

#: the launcher objects of a request, and the types of their fields
LAUNCHER_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {"ray": RAY_FIELDS, "k8s": K8S_FIELDS}
#: request fields that are no launcher setting: never read from or saved into a profile
NOT_SETTINGS = ("name", "cwd", "env", "notebook", "profile", "launcher")


def field_of(option: str) -> tuple[str | None, str] | None:
    """Where option ``option`` (``k8s-queue``) goes in a request: (``k8s``, ``queue``),
    (None, ``nodes``) for a field at the top, None when the request has none for it."""
    owner = owner_of(f"--{option}")
    if owner is not None:
        fields = LAUNCHER_FIELDS.get(owner, {})
        for prefix in (f"{owner}-", ""):
            if option.startswith(prefix):
                name = option.removeprefix(prefix).replace("-", "_")
                for candidate in (name, f"{name}s"):
                    if candidate in fields:
                        return owner, candidate
        return None
    name = option.replace("-", "_")
    if name in REQUEST_FIELDS and name not in NOT_SETTINGS:
        return None, name
    return None


def _typed(value: Value, kinds: tuple[type, ...], where: str) -> Any:
    """A profile's value as the request's field takes it (``"30"`` for a number: 30)."""
    if list in kinds and isinstance(value, list):
        return value
    if list in kinds and str not in kinds and isinstance(value, str) and "," in value:
        return [_typed(part.strip(), kinds, where) for part in value.split(",")]
    if kinds == (list,):
        return value if isinstance(value, list) else [value]
    if int in kinds and not isinstance(value, bool):
        if isinstance(value, int) or (isinstance(value, float) and float in kinds):
            return value
        text = str(value).strip()
        try:
            number = float(text) if float in kinds else int(text, 10) if len(text) < 19 else None
        except ValueError:
            number = None
        if number is None:
            expected = "a number" if float in kinds else "a whole number"
            raise SpecError(f"{where}: {cut(str(value))!r}; expected {expected}")
        return number
    if str in kinds:
        if isinstance(value, list):
            return ",".join(map(str, value))
        return str(value)
    return value


def request_of(profile: Profile) -> tuple[dict[str, Any], list[str]]:
    """The body of ``POST /sessions`` that ``profile`` asks for, and its fields the
    request has no place for (a cell's options, in the order written)."""
    body: dict[str, Any] = {}
    unused: list[str] = []
    launcher = profile.launcher
    if launcher in LAUNCHER_SWITCHES.values() or launcher == "ssh":
        body["launcher"] = launcher
    for option, value in profile.settings.items():
        where = profile.where(option)
        if option in LAUNCHER_SWITCHES:
            if value is not True and value is not False:
                raise SpecError(f"{where}: {cut(str(value))!r}; expected true or false")
            continue
        if option == "no-init":
            body["init"] = value is not True
            continue
        if option == "session":
            body["name"] = str(value)
            continue
        place = field_of(option)
        if place is None:
            if owner_of(f"--{option}") is not None:
                raise SpecError(
                    f"{where}: the server's requests have no field for --{option}; start "
                    "this profile from a notebook's cell"
                )
            unused.append(option)
            continue
        owner, name = place
        if owner is None:
            body[name] = _typed(value, REQUEST_FIELDS[name], where)
        else:
            body.setdefault(owner, {})[name] = _typed(value, LAUNCHER_FIELDS[owner][name], where)
    return body, unused


def settings_of(body: Mapping[str, Any]) -> dict[str, Value]:
    """A request's body as a profile's fields (the options a cell would give for it)."""
    settings: dict[str, Value] = {}
    launcher = body.get("launcher")
    if launcher in LAUNCHER_SWITCHES.values():
        settings[str(launcher)] = True
    for key, value in body.items():
        if key in NOT_SETTINGS or value is None:
            continue
        if key == "init":
            if value is False:
                settings["no-init"] = True
            continue
        if key in LAUNCHER_FIELDS:
            if key != launcher or not isinstance(value, dict):
                continue  # another launcher's object: not what the body starts
            options = {field_of(o[2:]): o[2:] for o in OPTIONS.get(key, {})}
            for name, item in value.items():
                option = options.get((key, name))
                if option is None:
                    raise SpecError(f"{key}.{name}: no %%distributed option sets it")
                if item is not None:
                    settings[option] = item
            continue
        settings[key.replace("_", "-")] = value
    return settings


def merged(profile_body: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` over the profile's: a field given replaces the profile's (``procs`` its
    ``gpus`` too), the launcher's object merged field by field when both are of one
    launcher."""
    out = dict(profile_body)
    if "gpus" in body or "procs" in body:
        out.pop("gpus", None)
        out.pop("procs", None)
    if body.get("launcher", out.get("launcher")) != out.get("launcher"):
        for key in (*LAUNCHER_FIELDS, "hosts"):
            out.pop(key, None)
    for key, value in body.items():
        if key in LAUNCHER_FIELDS and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


async def with_profile(body: Any) -> Any:
    """``body`` with its ``profile`` (a name) applied: the server's own profiles file,
    read in a thread, the profile's request checked alone first so that what is wrong with
    it is named by file and profile."""
    if not isinstance(body, dict) or body.get("profile") is None:
        return body
    name = body["profile"]
    if not isinstance(name, str):
        raise SpecError(f"profile: {cut(str(name))!r} is not a str")
    check_name(name, "profile")
    try:
        profile = await asyncio.wait_for(asyncio.to_thread(find_profile, name), FILE_CHECK_S)
    except asyncio.TimeoutError:
        raise SpecError(
            f"profile {name!r}: the file system did not answer within {FILE_CHECK_S:.0f} s"
        ) from None
    except SpecError as err:
        raise SpecError(f"profile: {err}".replace("profile: --profile ", "profile ")) from None
    own, _ = request_of(profile)
    try:
        shape_from_json(own)  # alone it may be short of a whole session: the values
    except SpecError as err:
        raise SpecError(f"profile {name!r} ({profile.path}): {err}") from None
    return merged(own, {k: v for k, v in body.items() if k != "profile"})


__all__ = ["field_of", "merged", "request_of", "settings_of", "with_profile"]
